"""The search-backend interface and the portable exact dense search.

A backend owns the keyword projection (engine-specific SQL lives only in its module) and serves
the dense leg. Both legs return only *visible* nodes: nodes whose generation is their document's
``active_generation``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from django.db.models import F

from ingestion.models import KnowledgeNode
from ingestion.projection import IndexedNode, ProjectionError
from knowledgefs.errors import ServiceError, Unavailable
from retrieval.models import DenseVector

logger = logging.getLogger("knowledgefs.retrieval")


class SearchBackendUnavailable(Unavailable):
    """503 ``search_backend_unavailable``: the database engine has no search backend (MySQL and
    MariaDB are supported for the schema, migrations and downgrades only)."""

    code = "search_backend_unavailable"


class SearchBackendError(ServiceError, ProjectionError):
    """A backend's store failed: ``status`` (503, or 413 for a quota), a stable ``code``,
    ``retryable`` (a later attempt may succeed; a compilation then retries) and, when set,
    ``retry_after`` seconds (sent as ``Retry-After``). It is an
    :class:`~ingestion.projection.ProjectionError`: compilation classifies it through the port."""

    status = 503
    code = "search_backend_unavailable"

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 503,
        retryable: bool = True,
        details=None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.status = status
        self.retryable = retryable
        if retry_after is not None:
            self.headers = {"Retry-After": str(retry_after)}


@dataclass(frozen=True)
class ScoredNode:
    """A leg's hit: node id and the leg's raw score (higher is better)."""

    node_id: uuid.UUID
    score: float


class SearchBackend:
    """Keyword and dense projections of knowledge nodes.

    Subclasses implement the keyword projection (``_index_keywords``, ``_delete_keywords``,
    ``keyword_search``). Dense vectors are stored portably in :class:`DenseVector` and searched
    exactly (cosine = dot product of unit vectors) over an in-process matrix cached per
    ``(space, index version, publication head revision)``.
    """

    def __init__(self) -> None:
        self._dense_cache: OrderedDict[tuple, tuple[list[uuid.UUID], np.ndarray]] = OrderedDict()
        # Per cached matrix: each row's document as a small integer, and document id → integer
        # (filters restrict the rows to the allowed documents before the top-k).
        self._dense_documents: dict[tuple, tuple[np.ndarray, dict[uuid.UUID, int]]] = {}
        self._dense_lock = threading.Lock()
        self._build_locks: dict[tuple, threading.Lock] = {}
        self.dense_cache_spaces = 8

    # --- writes -----------------------------------------------------------------------------
    def index_keywords(self, nodes: list[IndexedNode]) -> None:
        """Write the keyword projection of ``nodes`` (once per node, whatever the versions)."""
        if nodes:
            self._index_keywords(nodes)

    def index_dense(
        self,
        nodes: list[IndexedNode],
        vectors: np.ndarray,
        *,
        index_version: int,
        model_id: str,
        ignore_conflicts: bool = False,
    ) -> None:
        """Write one index version's vectors of ``nodes`` (``vectors`` shape ``(n, dim)``).

        Every row gets the matrix's dimension, so one call never mixes dimensions; the caller
        (:mod:`retrieval.index_versions`) checks it against the version. ``ignore_conflicts``
        keeps a vector another writer stored first (rebuilds); the compiler's own writes never
        collide.
        """
        if not nodes:
            return
        if vectors.ndim != 2 or vectors.shape[0] != len(nodes):
            raise ValueError(f"{len(nodes)} nodes but vectors of shape {vectors.shape}")
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        DenseVector.objects.bulk_create(
            [
                DenseVector(
                    node_id=n.id,
                    space_id=n.space_id,
                    index_version=index_version,
                    model_id=model_id,
                    dimension=vectors.shape[1],
                    vector=vectors[i].tobytes(),
                )
                for i, n in enumerate(nodes)
            ],
            batch_size=500,
            ignore_conflicts=ignore_conflicts,
        )

    def delete_nodes(self, node_ids: list[uuid.UUID]) -> None:
        """Remove every projection of these nodes, in every index version (call before deleting
        the nodes)."""
        if node_ids:
            self._delete_keywords(node_ids)
            DenseVector.objects.filter(node_id__in=node_ids).delete()

    def prepare_dense_index(self, model_id: str, dimension: int) -> None:
        """Make ready whatever index serves dense queries of ``(model_id, dimension)``: nothing
        for the exact in-process search; the HNSW index on PostgreSQL. Idempotent."""

    def delete_version_vectors(
        self, space_id: uuid.UUID, index_version: int, rows: list[tuple[uuid.UUID, int]]
    ) -> None:
        """Called before a retired version's :class:`DenseVector` rows are deleted (``rows``:
        ``(node id, dimension)``); a backend storing vectors elsewhere deletes them there."""

    def _index_keywords(self, nodes: list[IndexedNode]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def projection_counts(self, space_id: uuid.UUID) -> dict[str, int]:
        """Rows in each projection for a space (all generations): ``{"keyword", "dense"}``.

        For diagnostics and tests: after a document is published or deleted these equal the
        space's node count.
        """
        return {
            "keyword": self._keyword_row_count(space_id),
            "dense": DenseVector.objects.filter(space_id=space_id).count(),
        }

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    # --- reads ------------------------------------------------------------------------------
    @staticmethod
    def visible_node_ids(node_ids: list[uuid.UUID]) -> set[uuid.UUID]:
        """The subset of ``node_ids`` whose generation is their document's active one and whose
        document is enabled (a disabled document's nodes are never returned)."""
        if not node_ids:
            return set()
        return set(
            KnowledgeNode.objects.filter(
                id__in=node_ids,
                generation=F("document__active_generation"),
                document__enabled=True,
            ).values_list("id", flat=True)
        )

    def keyword_search(
        self,
        space_id: uuid.UUID,
        query: str,
        limit: int,
        *,
        documents: frozenset | None = None,
        language: str | None = None,
    ) -> list[ScoredNode]:  # pragma: no cover - abstract
        """BM25-style keyword hits, best first, at most ``limit``.

        ``documents`` (``None``: all) restricts the hits to those documents inside the query,
        before the limit; ``language`` is the planner's query language
        (:func:`retrieval.text.keyword_terms`).
        """
        raise NotImplementedError

    def dense_search(
        self,
        space_id: uuid.UUID,
        query_vector: np.ndarray,
        *,
        index_version: int,
        head_revision: int,
        limit: int,
        dimension: int | None = None,
        documents: frozenset | None = None,
        model_id: str | None = None,
    ) -> list[ScoredNode]:
        """Exact cosine top-``limit`` over the space's visible vectors of one index version.

        ``dimension`` is the version's; rows of any other dimension are left out of the matrix
        (and logged), so the matrix never mixes dimensions. ``documents`` (``None``: all)
        restricts the rows to those documents before the top-``limit`` is taken. ``model_id``
        (the version's model) is not needed here; an indexed backend uses it to pick its index.
        """
        key = (space_id, index_version, head_revision)
        node_ids, matrix = self._dense_matrix(
            space_id, index_version, head_revision, dimension or query_vector.shape[0]
        )
        if not node_ids:
            return []
        if matrix.shape[1] != query_vector.shape[0]:
            raise ValueError(
                f"query vector has {query_vector.shape[0]} dimensions, index has {matrix.shape[1]}"
            )
        rows = None
        if documents is not None:
            rows = self._rows_of_documents(key, documents)
            if rows is None:  # evicted between the two reads: use a fresh build's mapping
                node_ids, matrix = self._build_dense_matrix(key, matrix.shape[1])
                rows = self._rows_of_documents(key, documents)
                rows = np.empty(0, dtype=np.int64) if rows is None else rows
            if not len(rows):
                return []
            scores = matrix[rows] @ query_vector.astype(np.float32)
        else:
            scores = matrix @ query_vector.astype(np.float32)
        k = min(limit, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        if rows is not None:
            return [ScoredNode(node_ids[rows[i]], float(scores[i])) for i in top]
        return [ScoredNode(node_ids[i], float(scores[i])) for i in top]

    def _rows_of_documents(self, key: tuple, documents: frozenset) -> np.ndarray | None:
        """Matrix rows whose node belongs to one of ``documents`` (``None``: not cached)."""
        with self._dense_lock:
            entry = self._dense_documents.get(key)
        if entry is None:
            return None
        row_documents, codes = entry
        wanted = np.fromiter((codes[d] for d in documents if d in codes), dtype=np.int32)
        return np.flatnonzero(np.isin(row_documents, wanted))

    def _dense_matrix(
        self, space_id: uuid.UUID, index_version: int, head_revision: int, dimension: int
    ) -> tuple[list[uuid.UUID], np.ndarray]:
        key = (space_id, index_version, head_revision)
        with self._dense_lock:
            if key in self._dense_cache:
                self._dense_cache.move_to_end(key)
                return self._dense_cache[key]
            build_lock = self._build_locks.setdefault(key[:2], threading.Lock())
        # One thread per (space, version) rebuilds; the others wait for its result.
        with build_lock:
            with self._dense_lock:
                if key in self._dense_cache:
                    return self._dense_cache[key]
            return self._build_dense_matrix(key, dimension)

    def _build_dense_matrix(self, key: tuple, dimension: int) -> tuple[list[uuid.UUID], np.ndarray]:
        space_id, index_version, _ = key
        rows = (
            DenseVector.objects.filter(
                space_id=space_id,
                index_version=index_version,
                node__generation=F("node__document__active_generation"),
                node__document__enabled=True,
            )
            .order_by("node_id")
            .values_list("node_id", "dimension", "vector", "node__document_id")
        )
        ids: list[uuid.UUID] = []
        codes: dict[uuid.UUID, int] = {}
        row_documents: list[int] = []
        matrix = np.empty((1024, dimension), dtype=np.float32)  # grown geometrically
        foreign = 0
        for node_id, row_dimension, vector, document_id in rows.iterator(chunk_size=2000):
            if row_dimension != dimension or len(vector) != 4 * dimension:
                foreign += 1
                continue
            if len(ids) == matrix.shape[0]:
                matrix = np.resize(matrix, (matrix.shape[0] * 2, dimension))
            matrix[len(ids)] = np.frombuffer(vector, dtype="<f4")
            ids.append(node_id)
            row_documents.append(codes.setdefault(document_id, len(codes)))
        if foreign:
            logger.error(
                "index v%s of space %s: left out %d vectors whose dimension is not %d",
                index_version,
                space_id,
                foreign,
                dimension,
            )
        matrix = np.ascontiguousarray(matrix[: len(ids)])
        with self._dense_lock:
            for stale in [k for k in self._dense_cache if k[0] == space_id and k != key]:
                del self._dense_cache[stale]
            self._dense_cache[key] = (ids, matrix)
            self._dense_documents[key] = (np.asarray(row_documents, dtype=np.int32), codes)
            while len(self._dense_cache) > self.dense_cache_spaces:
                self._dense_cache.popitem(last=False)
            for gone in [k for k in self._dense_documents if k not in self._dense_cache]:
                del self._dense_documents[gone]
        return ids, matrix
