"""Which runtime serves models, object storage and datasources, and process-wide access to it.

``settings.KNOWLEDGE_MODEL_RUNTIME`` is ``local`` (the embedded default) or ``dify``:

- object storage (``STORAGES["objects"]``): ``FileSystemStorage`` under ``var/objects``
  (local), ``DifyObjectStorage`` (dify);
- model runtime (:func:`model_runtime`): none under local (the local ONNX embedding model only,
  no reranker, no LLM), ``DifyModelRuntime`` under dify;
- datasources (:func:`datasources`): none under local, ``DifyDatasources`` under dify.

Settings choose the storage (``knowledgefs.boundary.objects_storage``); this module hands out
the Dify clients. Each client is built once per process and per configuration (URL, key,
timeouts, caps) and shared by every thread; the clients hold no per-call state and share one
pooled HTTP session (``knowledgefs.dify.transport``). Under ``local`` the accessors raise
:class:`CapabilityUnavailable` (code ``capability_unavailable``) rather than return ``None``, so
a caller that forgot to check :func:`uses_dify` gets a clear error and not an ``AttributeError``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings

from knowledgefs.boundary import DIFY, LOCAL, parse_model_runtime
from knowledgefs.dify.datasources import DifyDatasources
from knowledgefs.dify.model_runtime import DifyModelRuntime
from knowledgefs.errors import ServiceError

__all__ = [
    "CapabilityUnavailable",
    "datasources",
    "model_runtime",
    "runtime_name",
    "uses_dify",
]


class CapabilityUnavailable(ServiceError):
    """The selected runtime does not provide this capability (a reranker, an LLM, datasources
    under ``KNOWLEDGE_MODEL_RUNTIME=local``).

    HTTP 503 with code ``capability_unavailable``; ``capability`` names what is missing
    (``model_runtime``, ``datasources``) and ``runtime`` the selected runtime. Not retryable:
    only a change of configuration makes it available.
    """

    status = 503
    code = "capability_unavailable"
    retryable = False

    def __init__(self, capability: str, runtime: str) -> None:
        self.capability = capability
        self.runtime = runtime
        super().__init__(
            f"{capability} is not available with KNOWLEDGE_MODEL_RUNTIME={runtime}: it is "
            "provided through Dify's inner API (KNOWLEDGE_MODEL_RUNTIME=dify)",
            details={"capability": capability, "runtime": runtime},
        )


def runtime_name() -> str:
    """The selected runtime: ``"local"`` or ``"dify"``."""
    return parse_model_runtime(getattr(settings, "KNOWLEDGE_MODEL_RUNTIME", LOCAL))


def uses_dify() -> bool:
    """True when models, object storage and datasources go through Dify."""
    return runtime_name() == DIFY


T = TypeVar("T")

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], object] = {}


def _configuration() -> tuple[Any, ...]:
    """What a client is built from; a different tuple (a test's settings) builds a new one.
    The key enters as a digest so the cache key never holds it."""
    key = getattr(settings, "DIFY_INNER_API_KEY", "") or ""
    return (
        getattr(settings, "DIFY_INNER_API_URL", ""),
        hashlib.sha256(key.encode()).hexdigest(),
        getattr(settings, "DIFY_MODEL_RUNTIME_TIMEOUT_MS", None),
        getattr(settings, "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES", None),
        getattr(settings, "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY", None),
    )


def _shared(kind: str, build: Callable[[], T]) -> T:
    runtime = runtime_name()
    if runtime != DIFY:
        raise CapabilityUnavailable(kind, runtime)
    key = (kind, *_configuration())
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = build()
    return client  # type: ignore[return-value]  # stored under a key naming its kind


def model_runtime() -> DifyModelRuntime:
    """The process-wide :class:`DifyModelRuntime` (embeddings, rerank, LLM streams, the model
    catalog) on ``DIFY_INNER_API_URL`` with the ``DIFY_MODEL_RUNTIME_*`` settings.

    Raises :class:`CapabilityUnavailable` under ``KNOWLEDGE_MODEL_RUNTIME=local`` and
    ``DifyNotConfigured`` (an ``ImproperlyConfigured``) if the URL or key is missing."""
    return _shared("model_runtime", DifyModelRuntime)


def datasources() -> DifyDatasources:
    """The process-wide :class:`DifyDatasources` (by Dify-managed ``credential_id`` only).

    Raises :class:`CapabilityUnavailable` under ``KNOWLEDGE_MODEL_RUNTIME=local``."""
    return _shared("datasources", DifyDatasources)
