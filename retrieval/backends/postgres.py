"""PostgreSQL search backend: BM25 impact lists for the keyword leg, pgvector + HNSW for the dense.

Keyword leg: :mod:`retrieval.backends.pgkeyword` (tables of migration ``retrieval.0010``):
postings and statistics are written and deleted with their nodes in the caller's transaction;
queries are OR-ed terms (like the FTS5 query) ranked by BM25 and answered by the Threshold
Algorithm under a postings budget (:mod:`retrieval.backends.threshold`): its reads are bounded by
``limit`` and the query's terms, not by the matching rows; exact whenever proved within it.

Dense leg: the ``embedding`` column and the per-model HNSW indexes of migration
``retrieval.0008`` (:mod:`retrieval.backends.pgvector`). One SQL statement applies the space,
index version, publication (node generation = the document's active one), enabled and filter
conditions and orders by the indexed expression before its ``LIMIT``; pgvector's iterative
scans keep reading the index until enough rows pass those conditions.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import numpy as np
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from retrieval.models import IndexVersion
from retrieval.text import is_lone_cjk, keyword_terms

from . import pgkeyword, pgvector
from .base import DenseHits, IndexedNode, ScoredNode, SearchBackend

DENSE_BATCH = 500  # rows per executemany of dense vectors
#: Bound of one HNSW attempt, ms. Past it the statement is cancelled and the exact scan
#: answers (reported like a short scan): a plan that joins the iterative index scan as the inner
#: side of a nested loop rescans the index per outer row and can run for minutes.
HNSW_ATTEMPT_TIMEOUT_MS = 5000

logger = logging.getLogger("knowledgefs.retrieval")

# The ordered, filtered, limited candidate list, then the final order recomputed in full
# precision (a relaxed-order iterative scan may return rows slightly out of order, and a halfvec
# index ranks in half precision). ``<#>`` is the negative inner product.
#
# Visibility (published generation, enabled, allowed documents) is a scalar subquery per
# candidate row, not a join: joined, the planner multiplies the selectivities of
# ``n.document_id = d.id`` and ``n.generation = d.active_generation`` (correlated, not
# independent), expects a handful of visible rows and drives the query from the nodes table, so
# the HNSW index is never used. As a filter of the vector scan it is evaluated on the rows the
# index yields, in distance order, until ``LIMIT`` rows passed (two primary-key lookups each).
DENSE_SQL = (
    "WITH hits AS MATERIALIZED ("
    "SELECT v.node_id, v.embedding FROM retrieval_densevector v "
    "WHERE v.model_id = %s AND v.dimension = %s AND v.space_id = %s AND v.index_version = %s "
    "AND (SELECT n.generation = d.active_generation AND d.enabled {only}"
    "FROM ingestion_knowledgenode n JOIN ingestion_document d ON d.id = n.document_id "
    "WHERE n.id = v.node_id) "
    "ORDER BY {expression} <#> %s::{kind}({dimension}) LIMIT %s) "
    "SELECT node_id, -(embedding <#> %s::vector) AS score FROM hits "
    "ORDER BY score DESC, node_id"
)


class PostgresSearchBackend(SearchBackend):
    # --- keyword leg (BM25 impact lists, retrieval.backends.pgkeyword) --------------------------
    def _index_keywords(self, nodes: list[IndexedNode]) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            pgkeyword.write(cursor, nodes)

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            pgkeyword.delete(cursor, node_ids)

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:
        with connection.cursor() as cursor:
            return pgkeyword.row_count(cursor, space_id)

    def rebuild_keywords(self, space_id: uuid.UUID) -> int:
        """Rebuild the space's keyword postings and BM25 statistics from its nodes in one
        transaction (queries see the old index until it commits; A₀ becomes the space's true
        average length). Returns the number of nodes indexed."""
        with transaction.atomic(), connection.cursor() as cursor:
            return pgkeyword.rebuild(cursor, space_id)

    def keyword_search(
        self,
        space_id: uuid.UUID,
        query: str,
        limit: int,
        *,
        documents: frozenset | None = None,
        language: str | None = None,
        head_revision: int | None = None,
        trace: dict | None = None,
    ) -> list[ScoredNode]:
        """The BM25 top ``limit`` visible nodes (:func:`pgkeyword.search`: the Threshold Algorithm
        over impact lists under a postings budget); ``documents`` (filters) applies before the
        limit. Reads one snapshot (``REPEATABLE READ``, read-only) unless the caller is inside a
        transaction."""
        terms = keyword_terms(query, language)
        if not terms or limit <= 0 or (documents is not None and not documents):
            return []
        prefix = [is_lone_cjk(t) for t in terms]
        allowed = None if documents is None else [str(d) for d in documents]
        own = not connection.in_atomic_block
        with transaction.atomic(), connection.cursor() as cursor:
            if own:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            hits = pgkeyword.search(cursor, space_id, terms, prefix, limit, allowed, trace=trace)
        return [ScoredNode(uuid.UUID(node), score) for node, score in hits]

    # --- dense leg (pgvector) -------------------------------------------------------------------
    def prepare_dense_index(self, model_id: str, dimension: int) -> None:
        """The HNSW index of ``(model_id, dimension)``
        (:func:`retrieval.backends.pgvector.ensure_hnsw_index`; ``CONCURRENTLY`` outside a
        transaction). A refusal is logged, not raised: queries stay correct without the index
        (an exact scan) and the next version created or rebuilt for the pair tries again."""
        try:
            pgvector.ensure_hnsw_index(connection, model_id, dimension)
        except DatabaseError:
            logger.exception("could not create the HNSW index of %s (%d dims)", model_id, dimension)

    def index_dense(
        self,
        nodes: list[IndexedNode],
        vectors: np.ndarray,
        *,
        index_version: int,
        model_id: str,
        ignore_conflicts: bool = False,
    ) -> None:
        """:meth:`SearchBackend.index_dense`, writing the float32 bytes and the pgvector column
        together: multi-row ``INSERT`` statements of :data:`DENSE_BATCH` rows
        (``ON CONFLICT (node_id, index_version) DO NOTHING`` with ``ignore_conflicts``)."""
        if not nodes:
            return
        if vectors.ndim != 2 or vectors.shape[0] != len(nodes):
            raise ValueError(f"{len(nodes)} nodes but vectors of shape {vectors.shape}")
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        dimension = int(vectors.shape[1])
        conflict = " ON CONFLICT (node_id, index_version) DO NOTHING" if ignore_conflicts else ""
        with connection.cursor() as cursor:
            for start in range(0, len(nodes), DENSE_BATCH):
                batch = range(start, min(start + DENSE_BATCH, len(nodes)))
                params: list = []
                for i in batch:
                    params += [
                        nodes[i].id,
                        nodes[i].space_id,
                        index_version,
                        model_id,
                        dimension,
                        vectors[i].tobytes(),
                        pgvector.vector_literal(vectors[i]),
                    ]
                values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s::vector)"] * len(batch))
                cursor.execute(
                    f"INSERT INTO {pgvector.TABLE} (node_id, space_id, index_version, model_id, "
                    f"dimension, vector, {pgvector.COLUMN}) VALUES {values}{conflict}",
                    params,
                )

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
        """Top-``limit`` visible vectors of one index version by inner product (= cosine
        similarity of unit vectors, the exact path's score), best first, in SQL.

        The statement orders by the ``(model_id, dimension)`` HNSW index's expression under
        ``hnsw.iterative_scan = relaxed_order`` (``hnsw.ef_search`` =
        ``KNOWLEDGE_PG_HNSW_EF_SEARCH``, at least ``limit``; ``hnsw.max_scan_tuples`` =
        ``KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES``), with every condition (space, version,
        publication, enabled, ``documents``) before its ``LIMIT``; the ``limit`` rows are then
        ordered again exactly. When fewer than ``limit`` rows come back (few rows pass the
        filters, or the scan reached its tuple budget first) the query is answered by an exact
        scan of the space's rows instead, so a restrictive filter never loses recall.
        ``head_revision`` is unused (no cache to key). Raises :class:`ValueError` when the query
        vector's length is not ``dimension``.
        """
        dimension = int(dimension or query_vector.shape[0])
        if query_vector.ndim != 1 or query_vector.shape[0] != dimension:
            raise ValueError(
                f"query vector has {query_vector.shape[0]} dimensions, index has {dimension}"
            )
        if limit <= 0 or (documents is not None and not documents):
            return []
        if model_id is None:
            model_id = (
                IndexVersion.objects.filter(space_id=space_id, number=index_version)
                .values_list("model_id", flat=True)
                .first()
            )
            if model_id is None:
                return []
        query = pgvector.vector_literal(query_vector)
        args = (space_id, query, model_id, dimension, index_version, limit, documents)
        indexed = pgvector.index_type(dimension) is not None
        hits = self._hnsw_query(*args) if indexed else self._exact_query(*args)
        if hits is None:
            # The HNSW attempt ran past HNSW_ATTEMPT_TIMEOUT_MS and was cancelled.
            hits = DenseHits(self._exact_query(*args))
            hits.exact_fallback = (
                f"the HNSW scan was cancelled after {HNSW_ATTEMPT_TIMEOUT_MS} ms; "
                f"answered by the full scan ({len(hits)} rows)"
            )
            logger.warning("dense search of space %s: %s", space_id, hits.exact_fallback)
        elif indexed and len(hits) < limit:
            # Too few rows passed the conditions within the scan's budget (hnsw.max_scan_tuples,
            # or the candidates the iterative scan could reach): never a short answer, and
            # never silently: reported in the log and in the result's metrics.
            found = len(hits)
            hits = DenseHits(self._exact_query(*args))
            hits.exact_fallback = (
                f"the HNSW scan returned {found} of {limit} rows "
                f"(hnsw.max_scan_tuples {settings.KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES}); "
                f"answered by an exact scan ({len(hits)} rows)"
            )
            logger.info("dense search of space %s: %s", space_id, hits.exact_fallback)
        return hits

    def _exact_query(self, *args: Any) -> list[ScoredNode]:
        """Run :data:`DENSE_SQL` ordered by the uncast column, which no index serves (an exact
        scan); ``args`` as :func:`dense_statement`'s positional ones."""
        sql, params = dense_statement(*args, indexed=False)
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [ScoredNode(row[0], float(row[1])) for row in cursor.fetchall()]

    def _hnsw_query(self, *args: Any) -> list[ScoredNode] | None:
        """Run :data:`DENSE_SQL` ordered by the indexed expression. ``None`` when the attempt
        ran past :data:`HNSW_ATTEMPT_TIMEOUT_MS` (cancelled inside a savepoint, so the caller's
        transaction goes on)."""
        limit = args[5]
        sql, params = dense_statement(*args, indexed=True)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), "
                    "set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                    "set_config('hnsw.ef_search', %s, true), "
                    "set_config('hnsw.max_scan_tuples', %s, true), "
                    "set_config('statement_timeout', %s, true)",
                    [
                        str(min(1000, max(settings.KNOWLEDGE_PG_HNSW_EF_SEARCH, limit))),
                        str(settings.KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES),
                        str(HNSW_ATTEMPT_TIMEOUT_MS),
                    ],
                )
                (previous, *_) = cursor.fetchone()
                cursor.execute(sql, params)
                rows = [ScoredNode(row[0], float(row[1])) for row in cursor.fetchall()]
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
                return rows
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "57014":  # query_canceled
                raise
            return None


def dense_statement(
    space_id: uuid.UUID,
    query: str,
    model_id: str,
    dimension: int,
    index_version: int,
    limit: int,
    documents: frozenset | None,
    *,
    indexed: bool = True,
) -> tuple[str, list]:
    """``(sql, params)`` of the dense query :meth:`PostgresSearchBackend.dense_search` runs
    (``query``: the vector's text form); tests ``EXPLAIN`` exactly this statement."""
    only = "" if documents is None else "AND d.id = ANY(%s::uuid[]) "
    if indexed:
        expression = pgvector.indexed_expression(dimension, "v.")
        kind = pgvector.index_type(dimension)
    else:
        expression, kind = "v.embedding", "vector"
    sql = DENSE_SQL.format(only=only, expression=expression, kind=kind, dimension=int(dimension))
    params: list = [model_id, dimension, space_id, index_version]
    if documents is not None:
        params.append([str(d) for d in documents])
    return sql, [*params, query, limit, query]
