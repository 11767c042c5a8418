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
from django.conf import settings
from django.db import connection
from django.db.models import F

from ingestion.models import KnowledgeNode
from ingestion.projection import IndexedNode, ProjectionError
from knowledgefs.errors import ServiceError, Unavailable
from retrieval.models import DenseVector

from . import dense_matrix, dense_topk

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


def uuid_of_hex(value: str | bytes) -> uuid.UUID:
    """The UUID of 32 hex characters (as SQLite stores it): through its integer, which skips
    the text normalisation of ``UUID(hex)`` (the legs build one per hit)."""
    return uuid.UUID(int=int(value, 16))


@dataclass(frozen=True)
class ScoredNode:
    """A leg's hit: node id and the leg's raw score (higher is better)."""

    node_id: uuid.UUID
    score: float


class DenseHits(list):
    """A dense search's hits (:class:`ScoredNode`, best first) with ``exact_fallback``: why an
    approximate index scan was answered again by an exact scan (``""``: it was not)."""

    exact_fallback: str = ""


class SearchBackend:
    """Keyword and dense projections of knowledge nodes.

    Subclasses implement the keyword projection (``_index_keywords``, ``_delete_keywords``,
    ``keyword_search``). Dense vectors are stored portably in :class:`DenseVector` and searched
    (cosine = dot product of unit vectors) over an in-process matrix per
    ``(space, index version)`` that appends the rows of each new publication
    (:mod:`.dense_matrix`): exactly, or through its HNSW graph past
    ``KNOWLEDGE_DENSE_GRAPH_MIN_ROWS`` rows on SQLite (:mod:`.dense_graph`).
    """

    def __init__(self) -> None:
        # (space id, index version) → its matrix, least recently used first.
        self._dense_matrices: OrderedDict[tuple, dense_matrix.DenseMatrix] = OrderedDict()
        self._dense_lock = threading.Lock()
        self.dense_cache_spaces = 8
        # Compaction of a matrix's dead rows (dense_matrix.DenseMatrix).
        self.dense_compact_fraction = 0.25
        self.dense_compact_min_rows = 1024
        self.dense_compact_in_background = True

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
        head_revision: int | None = None,
    ) -> list[ScoredNode]:  # pragma: no cover - abstract
        """BM25-style keyword hits, best first, at most ``limit``.

        ``documents`` (``None``: all) restricts the hits to those documents inside the query,
        before the limit; ``head_revision`` is the snapshot's (an index kept per revision
        reloads when it moved; ``None``: read it); ``language`` is the planner's query language
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
        """Cosine top-``limit`` over the space's visible vectors of one index version, best
        first, ties by node id (exact below the graph's threshold, :func:`.dense_topk.search`).

        Served by the version's in-process :class:`~.dense_matrix.DenseMatrix`, brought to
        ``head_revision`` by appending the rows written since it was last read (never rebuilt
        for a new revision on SQLite); visibility is checked in SQL for the best candidates
        (:func:`.dense_topk.search`). ``dimension`` is the version's; rows of any other
        dimension are left out of the matrix (and logged), so it never mixes dimensions.
        ``documents`` (``None``: all) restricts the rows to those documents before the
        top-``limit`` is taken. ``model_id`` (the version's model) is not needed here; an
        indexed backend uses it to pick its index. Raises :class:`ValueError` when the query
        vector's length is not the index's.
        """
        dimension = int(dimension or query_vector.shape[0])
        matrix = self._dense_matrix(space_id, index_version, head_revision, dimension)
        if matrix.view.count == 0:
            return []
        if query_vector.shape[0] != dimension:
            raise ValueError(
                f"query vector has {query_vector.shape[0]} dimensions, index has {dimension}"
            )
        hits = dense_topk.search(
            matrix, query_vector, limit=limit, revision=head_revision, documents=documents
        )
        return [ScoredNode(uuid_of_hex(node), score) for node, score in hits]

    def dense_stats(self, space_id: uuid.UUID | None = None, index_version: int | None = None):
        """Counters of the matrix of ``(space_id, index_version)`` (default: the last one used),
        :meth:`~.dense_matrix.DenseMatrix.info`; ``{}`` when none is held."""
        with self._dense_lock:
            if space_id is None:
                matrix = next(reversed(self._dense_matrices.values()), None)
            else:
                matrix = self._dense_matrices.get((space_id, index_version))
        return matrix.info() if matrix is not None else {}

    def _dense_matrix(
        self, space_id: uuid.UUID, index_version: int, head_revision: int, dimension: int
    ) -> dense_matrix.DenseMatrix:
        """The version's matrix at ``head_revision`` or later (one writer per matrix: the
        others wait for its refresh, then read the new view)."""
        key = (space_id, index_version)
        incremental = connection.vendor == "sqlite"
        with self._dense_lock:
            matrix = self._dense_matrices.get(key)
            if matrix is None or matrix.dimension != dimension:
                matrix = dense_matrix.DenseMatrix(
                    space_id,
                    index_version,
                    dimension,
                    incremental=incremental,
                    compact_fraction=self.dense_compact_fraction,
                    compact_min_rows=self.dense_compact_min_rows,
                    compact_in_background=self.dense_compact_in_background,
                    graph_min_rows=settings.KNOWLEDGE_DENSE_GRAPH_MIN_ROWS if incremental else 0,
                    graph_ef_search=settings.KNOWLEDGE_DENSE_GRAPH_EF_SEARCH,
                )
                retired = [k for k in self._dense_matrices if k[0] == space_id and k[1] < key[1]]
                for older in retired:  # an older version's matrix: the space moved on
                    del self._dense_matrices[older]
                self._dense_matrices[key] = matrix
                while len(self._dense_matrices) > self.dense_cache_spaces:
                    self._dense_matrices.popitem(last=False)
            else:
                self._dense_matrices.move_to_end(key)
        # SQLite gives ids in commit order, so rows above the last id read are the new ones;
        # elsewhere the matrix is read again for each revision (the exact reference path).
        stale = (
            matrix.view.revision < head_revision
            if incremental
            else matrix.view.revision != head_revision
        )
        if stale:
            with matrix.lock:
                if incremental or matrix.view.revision != head_revision:
                    matrix.refresh(head_revision)
        return matrix
