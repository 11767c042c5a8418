"""The model-runtime boundary: every embedding call in KnowledgeFS goes through here.

``KNOWLEDGE_MODEL_RUNTIME=local`` (the embedded default) serves local int8 ONNX models
(:mod:`knowledgefs.runtime.local_embedding`: bge-small-en-v1.5, the default of new spaces, and
all-MiniLM-L6-v2); ``dify`` serves each space's embedding profile through Dify's inner model API
(:class:`knowledgefs.dify.embedding_model.DifyEmbeddingModel`).

Models are found by id, in two ways:

- **Registered ids.** The built-in local models are always registered (:data:`DEFAULT_MODEL_ID`,
  new spaces' model unless ``KNOWLEDGE_DEFAULT_EMBEDDING_MODEL`` names another, and
  :data:`MINILM_MODEL_ID`);
  ``settings.KNOWLEDGE_EMBEDDING_MODELS`` (``{model_id: "dotted.path.to.ClassOrFactory"}``) adds
  more. A registered class or factory is called without arguments and must return an object
  whose ``model_id`` is the id it is registered under. Each is built once per process (per id
  and dotted path) and shared by every thread.
- **Vector space ids** (``embedding-space-sha256:<hex>``): the index model id of a space whose
  embedding profile is served by Dify (``spaces.models.SpaceProfile.vector_space_id``). These
  need the space (``get_embedding_model(model_id, space=…)``): the model is bound to the space's
  tenant, whose model credentials Dify applies. One :class:`DifyEmbeddingModel` is kept per
  tenant, selection and vector space (at most :data:`DIFY_MODEL_POOL_SIZE`, least recently used
  dropped first), sharing one :class:`DifyModelRuntime` and its pooled HTTP session.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from django.conf import settings
from django.utils.module_loading import import_string

DEFAULT_MODEL_ID = "local/bge-small-en-v1.5-int8-onnx"
MINILM_MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
VECTOR_SPACE_PREFIX = "embedding-space-sha256:"
LOCAL_PLUGIN_ID = "local"
LOCAL_PROVIDER = "local"
DIFY_MODEL_POOL_SIZE = 256


class EmbeddingModel(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``model_id`` names model and revision; vectors from different ``model_id`` values never share
    an index. ``embed_documents`` returns shape ``(len(texts), dimension)``.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


class UnknownEmbeddingModel(LookupError):
    """No embedding model is registered under this id (the message lists the registered ones),
    or a vector space id this process cannot serve (``reason`` says why)."""

    def __init__(self, model_id: str, reason: str | None = None) -> None:
        self.model_id = model_id
        if reason is None:
            known = ", ".join(sorted(registered_model_ids()))
            reason = f"no embedding model is registered as {model_id!r}; registered: {known}"
        super().__init__(reason)


def is_vector_space_id(model_id: object) -> bool:
    return isinstance(model_id, str) and model_id.startswith(VECTOR_SPACE_PREFIX)


def _local_model(model_id: str) -> Callable[[], EmbeddingModel]:
    def build() -> EmbeddingModel:
        from .local_embedding import LOCAL_MODELS, LocalOnnxEmbedding

        return LocalOnnxEmbedding(
            model=LOCAL_MODELS[model_id],
            batch_size=settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE,
            threads=settings.KNOWLEDGE_EMBEDDING_THREADS,
        )

    return build


_BUILTIN: dict[str, Callable[[], EmbeddingModel]] = {
    DEFAULT_MODEL_ID: _local_model(DEFAULT_MODEL_ID),
    MINILM_MODEL_ID: _local_model(MINILM_MODEL_ID),
}


def default_model_id() -> str:
    """The local model a new space gets: ``KNOWLEDGE_DEFAULT_EMBEDDING_MODEL`` when set (a
    registered id), else :data:`DEFAULT_MODEL_ID`. Existing spaces keep the model of their
    embedding profile."""
    chosen = getattr(settings, "KNOWLEDGE_DEFAULT_EMBEDDING_MODEL", "") or DEFAULT_MODEL_ID
    if not is_registered(chosen):
        raise UnknownEmbeddingModel(chosen)
    return chosen


_lock = threading.Lock()
_models: dict[tuple[str, object], EmbeddingModel] = {}


def _factories() -> dict[str, str | Callable[[], EmbeddingModel]]:
    """``{model_id: factory or dotted path}``: the built-in models, then the configured ones."""
    configured = getattr(settings, "KNOWLEDGE_EMBEDDING_MODELS", None) or {}
    return {**_BUILTIN, **configured}


def registered_model_ids() -> list[str]:
    """Ids of every embedding model this process can serve."""
    return list(_factories())


def is_registered(model_id: str) -> bool:
    return isinstance(model_id, str) and model_id in _factories()


def get_embedding_model(model_id: str | None = None, *, space: Any = None) -> EmbeddingModel:
    """Return the embedding model ``model_id`` (:func:`default_model_id` without one).

    A registered id is served by its factory, built once per process and shared. A vector space
    id (``embedding-space-sha256:…``) is served from ``space``'s embedding profile (a
    ``KnowledgeSpace`` or its id) through Dify, and only while ``KNOWLEDGE_MODEL_RUNTIME=dify``.
    Raises :class:`UnknownEmbeddingModel` for an id nobody registered, a vector space id without
    its space, or one that is not the space's profile.
    """
    model_id = model_id or default_model_id()
    if is_vector_space_id(model_id):
        return _profile_model(model_id, space)
    factory = _factories().get(model_id)
    if factory is None:
        raise UnknownEmbeddingModel(model_id)
    key = (model_id, factory)
    model = _models.get(key)
    if model is None:
        with _lock:
            model = _models.get(key)
            if model is None:
                build: Callable[[], EmbeddingModel] = (
                    import_string(factory) if isinstance(factory, str) else factory
                )
                model = build()
                if model.model_id != model_id:
                    raise RuntimeError(
                        f"the model registered as {model_id!r} reports model_id "
                        f"{model.model_id!r}; register it under its own id"
                    )
                _models[key] = model
    return model


# The runtime selection and the Dify clients (knowledgefs/runtime/selection.py).
from . import selection as _selection  # noqa: E402 - after the registry

# Re-exported (importers use knowledgefs.runtime.<name>).
CapabilityUnavailable = _selection.CapabilityUnavailable
datasources = _selection.datasources
model_runtime = _selection.model_runtime
runtime_name = _selection.runtime_name
uses_dify = _selection.uses_dify

# --- models served by Dify, per space profile ------------------------------------------------

_dify_lock = threading.Lock()
_dify_models: OrderedDict[tuple[object, ...], EmbeddingModel] = OrderedDict()


def dify_embedding_model(
    *,
    tenant_id: str,
    plugin_id: str,
    provider: str,
    model: str,
    model_id: str,
    dimension: int | None,
) -> EmbeddingModel:
    """The pooled :class:`DifyEmbeddingModel` of one tenant and selection, whose ``model_id`` is
    ``model_id`` (a vector space id) and whose vectors must have ``dimension``."""
    from knowledgefs.dify.embedding_model import DifyEmbeddingModel

    client = model_runtime()  # the shared DifyModelRuntime of this configuration
    key = (id(client), tenant_id, plugin_id, provider, model, model_id, dimension)
    with _dify_lock:
        found = _dify_models.get(key)
        if found is not None:
            _dify_models.move_to_end(key)
            return found
    built = DifyEmbeddingModel(
        tenant_id=tenant_id,
        provider=f"{plugin_id}/{provider}",
        model=model,
        model_id=model_id,
        dimension=dimension,
        runtime=client,
    )
    with _dify_lock:
        found = _dify_models.setdefault(key, built)
        _dify_models.move_to_end(key)
        while len(_dify_models) > DIFY_MODEL_POOL_SIZE:
            _dify_models.popitem(last=False)
    return found


SpaceModels = Callable[[str, Any], EmbeddingModel]
_space_models: SpaceModels | None = None


def register_space_models(resolver: SpaceModels) -> None:
    """Install the resolver of vector space ids: ``resolver(model_id, space)`` returns the
    space's profile model or raises :class:`UnknownEmbeddingModel`. The spaces app registers
    :func:`spaces.profiles.embedding_model` in its ``AppConfig.ready()``; the runtime imports
    no app."""
    global _space_models
    _space_models = resolver


def _profile_model(model_id: str, space: Any) -> EmbeddingModel:
    if space is None:
        raise UnknownEmbeddingModel(
            model_id, f"{model_id!r} is a vector space id; it is served only for its space"
        )
    if _space_models is None:
        raise RuntimeError("no resolver of vector space ids is registered (is 'spaces' installed?)")
    return _space_models(model_id, space)
