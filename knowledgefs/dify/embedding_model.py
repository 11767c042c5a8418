"""Dify's embedding models as :class:`knowledgefs.runtime.EmbeddingModel` (compiler and retrieval).

:class:`DifyEmbeddingModel` binds one tenant, provider and model to the
:class:`~knowledgefs.dify.model_runtime.DifyModelRuntime` client: a fixed dimension (given, or the
first answer's, probed once when read before any answer), L2-normalised float32 rows, documents
embedded with ``input_type=document`` and queries with ``query``.
"""

from __future__ import annotations

import threading

import numpy as np

from .errors import ModelRuntimeError
from .model_runtime import DifyModelRuntime, canonical_provider, checked_identifier

PROBE_TEXT = "KnowledgeFS embedding dimension probe"


class DifyEmbeddingModel:
    """An embedding model served by Dify, for :mod:`knowledgefs.runtime` (``EmbeddingModel``).

    Bound to one tenant (Dify applies that tenant's model credentials), provider and model.
    ``model_id`` defaults to ``dify/<provider>/<model>``. ``dimension`` is the one given, or the
    one observed in the first real answer; when nothing was embedded yet, reading it embeds a
    short probe text once. Every later answer must have that dimension
    (``EMBEDDING_DIMENSION_MISMATCH`` otherwise). Vectors are L2-normalised float32;
    documents are embedded with ``input_type=document``, queries with ``query``.
    """

    def __init__(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        model_id: str | None = None,
        dimension: int | None = None,
        runtime: DifyModelRuntime | None = None,
    ) -> None:
        self.tenant_id = checked_identifier(tenant_id, "tenant_id", 512)
        self.provider = canonical_provider(provider)
        self.model = checked_identifier(model, "model", 256)
        self.model_id = model_id or f"dify/{self.provider}/{self.model}"
        self.runtime = runtime or DifyModelRuntime()
        self._dimension = dimension
        self._probe_lock = threading.Lock()
        self._record_lock = threading.Lock()

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            with self._probe_lock:
                if self._dimension is None:
                    self._embed([PROBE_TEXT], "query")
        assert self._dimension is not None
        return self._dimension

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), dimension)`` float32, unit rows, in input order."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self._embed(list(texts), "document")

    def embed_query(self, text: str) -> np.ndarray:
        """``(dimension,)`` float32 of unit norm."""
        vector: np.ndarray = self._embed([text], "query")[0]
        return vector

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Several queries in one call (``input_type=query``): ``(len(texts), dimension)``."""
        return self._embed(list(texts), "query")

    def _embed(self, texts: list[str], input_type: str) -> np.ndarray:
        matrix = self.runtime.embed_texts(
            tenant_id=self.tenant_id,
            provider=self.provider,
            model=self.model,
            texts=texts,
            input_type=input_type,
            expected_dimension=self._dimension,
        )
        with self._record_lock:
            if self._dimension is None:
                self._dimension = int(matrix.shape[1])
        if matrix.shape[1] != self._dimension:  # two first calls at once that disagreed
            raise ModelRuntimeError.of(
                "dimension",
                f"{self.model_id} returned {matrix.shape[1]}-d vectors, "
                f"{self._dimension}-d expected",
            )
        return matrix
