"""The model-runtime boundary: every embedding call in KnowledgeFS goes through here.

``KNOWLEDGE_MODEL_RUNTIME=local`` (the embedded default) serves a local all-MiniLM-L6-v2 int8 ONNX
model. The Dify inner model API arrives behind the same interface.

Models are registered by id. The default local model is always registered;
``settings.KNOWLEDGE_EMBEDDING_MODELS`` (``{model_id: "dotted.path.to.ClassOrFactory"}``) adds
more. A registered class or factory is called without arguments and must return an object whose
``model_id`` is the id it is registered under. Each model is built once per process (per id and
dotted path) and shared by every thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np
from django.conf import settings
from django.utils.module_loading import import_string

DEFAULT_MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"


class EmbeddingModel(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``model_id`` names model and revision; vectors from different ``model_id`` values never share
    an index. ``embed_documents`` returns shape ``(len(texts), dimension)``.
    """

    model_id: str
    dimension: int

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


class UnknownEmbeddingModel(LookupError):
    """No embedding model is registered under this id (the message lists the registered ones)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        known = ", ".join(sorted(registered_model_ids()))
        super().__init__(f"no embedding model is registered as {model_id!r}; registered: {known}")


def _local_model() -> EmbeddingModel:
    from .local_embedding import LocalOnnxEmbedding

    return LocalOnnxEmbedding(
        batch_size=settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE,
        threads=settings.KNOWLEDGE_EMBEDDING_THREADS,
    )


_BUILTIN: dict[str, Callable[[], EmbeddingModel]] = {DEFAULT_MODEL_ID: _local_model}

_lock = threading.Lock()
_models: dict[tuple[str, object], EmbeddingModel] = {}


def _factories() -> dict[str, object]:
    """``{model_id: factory or dotted path}``: the built-in models, then the configured ones."""
    configured = getattr(settings, "KNOWLEDGE_EMBEDDING_MODELS", None) or {}
    return {**_BUILTIN, **configured}


def registered_model_ids() -> list[str]:
    """Ids of every embedding model this process can serve."""
    return list(_factories())


def is_registered(model_id: str) -> bool:
    return isinstance(model_id, str) and model_id in _factories()


def get_embedding_model(model_id: str | None = None) -> EmbeddingModel:
    """Return the embedding model registered as ``model_id`` (the default model without one).

    Each model is built once per process and shared. Raises :class:`UnknownEmbeddingModel` for an
    id nobody registered.
    """
    model_id = model_id or DEFAULT_MODEL_ID
    factory = _factories().get(model_id)
    if factory is None:
        raise UnknownEmbeddingModel(model_id)
    key = (model_id, factory)
    model = _models.get(key)
    if model is None:
        with _lock:
            model = _models.get(key)
            if model is None:
                build = import_string(factory) if isinstance(factory, str) else factory
                model = build()
                if model.model_id != model_id:
                    raise RuntimeError(
                        f"the model registered as {model_id!r} reports model_id "
                        f"{model.model_id!r}; register it under its own id"
                    )
                _models[key] = model
    return model


# The runtime selection and the Dify clients (knowledgefs/runtime/selection.py).
from .selection import (  # noqa: E402, F401 - re-exported; after the registry
    CapabilityUnavailable,
    datasources,
    model_runtime,
    runtime_name,
    uses_dify,
)
