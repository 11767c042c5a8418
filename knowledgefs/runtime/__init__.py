"""The model-runtime boundary: every embedding call in KnowledgeFS goes through here.

``KNOWLEDGE_MODEL_RUNTIME=local`` (the embedded default) serves a local all-MiniLM-L6-v2 int8 ONNX
model. The Dify inner model API arrives behind the same interface.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np
from django.conf import settings


class EmbeddingModel(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``model_id`` names model and revision; vectors from different ``model_id`` values never share
    an index. ``embed_documents`` returns shape ``(len(texts), dimension)``.
    """

    model_id: str
    dimension: int

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


_lock = threading.Lock()
_model: EmbeddingModel | None = None


def get_embedding_model() -> EmbeddingModel:
    """Return the process-wide embedding model for the configured runtime (loaded once)."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                from .local_embedding import LocalOnnxEmbedding

                _model = LocalOnnxEmbedding(
                    batch_size=settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE,
                    threads=settings.KNOWLEDGE_EMBEDDING_THREADS,
                )
    return _model
