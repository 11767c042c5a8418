"""The evidence window: how many tokens the answer's evidence may fill, from the reasoning
model's context size in the Dify catalog (cached per process) or the configured default."""

from __future__ import annotations

import threading
import time

from django.conf import settings

from knowledgefs.dify.errors import DifyError
from knowledgefs.errors import ServiceError
from retrieval import evidence as ev

from .generation import SYSTEM_PROMPT
from .state import Generator

_catalog_lock = threading.Lock()
_catalog_sizes: dict[tuple, tuple[float, int | None]] = {}


def context_size(tenant_id: str, selection) -> int | None:
    """The reasoning model's context size in tokens from the Dify model catalog
    (``capabilities.model_properties.context_size``, else ``token_limits.context_size`` or
    ``token_limits.max_context_tokens``); ``None`` when the catalog has none or fails. Kept per
    process for ``KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS``."""
    from knowledgefs.runtime import model_runtime

    key = (tenant_id, str(selection))
    now = time.monotonic()
    with _catalog_lock:
        cached = _catalog_sizes.get(key)
        if cached is not None and now - cached[0] < settings.KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS:
            return cached[1]
    size = None
    try:
        page = model_runtime().list_models(
            tenant_id=tenant_id,
            model_type="llm",
            provider=selection.canonical_provider,
            model=selection.model,
            limit=10,
        )
    except (DifyError, ServiceError):
        return None
    for item in page.items:
        if (item.plugin_id, item.provider, item.model) != (
            selection.plugin_id,
            selection.provider,
            selection.model,
        ):
            continue
        size = _size_of(item)
        break
    with _catalog_lock:
        _catalog_sizes[key] = (now, size)
    return size


def _size_of(item) -> int | None:
    properties = (item.capabilities or {}).get("model_properties") or {}
    limits = item.token_limits or {}
    for value in (
        properties.get("context_size"),
        limits.get("context_size"),
        limits.get("max_context_tokens"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
            return value
    return None


def _window(space, generator: Generator, query: str) -> ev.Window:
    prompt = f"{SYSTEM_PROMPT}\n\nQuestion:\n{query}\n\nEvidence:\n"
    if generator.kind == "llm":
        size = context_size(space.tenant_id, generator.selection)
        if size is not None:
            return ev.window(size, prompt, source="catalog")
        return ev.window(settings.KNOWLEDGE_ANSWER_CONTEXT_TOKENS, prompt)
    return ev.window(settings.KNOWLEDGE_ANSWER_CONTEXT_TOKENS, query)
