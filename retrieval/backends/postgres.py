"""PostgreSQL search backend: a tsvector table with a GIN index for the keyword leg.

The table ``retrieval_keyword_tsv`` is created by migration ``retrieval.0002``; rows are deleted
with their nodes through :meth:`SearchBackend.delete_nodes`. Terms are OR-ed (like the FTS5
query) and ranked with ``ts_rank_cd``.
"""

from __future__ import annotations

import uuid

from django.db import connection

from retrieval.text import is_lone_cjk, keyword_terms, keyword_text

from .base import IndexedNode, ScoredNode, SearchBackend

TABLE = "retrieval_keyword_tsv"


class PostgresSearchBackend(SearchBackend):
    def _index_keywords(self, nodes: list[IndexedNode]) -> None:
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {TABLE} (node_id, space_id, tsv) "
                "VALUES (%s, %s, to_tsvector('english', %s))",
                [(n.id, n.space_id, keyword_text(n.text)) for n in nodes],
            )

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {TABLE} WHERE node_id = ANY(%s)", [list(node_ids)])

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE space_id = %s", [space_id])
            return cursor.fetchone()[0]

    def keyword_search(
        self,
        space_id: uuid.UUID,
        query: str,
        limit: int,
        *,
        documents: frozenset | None = None,
        language: str | None = None,
    ) -> list[ScoredNode]:
        """Top ``limit`` visible nodes by ``ts_rank_cd``; ``documents`` (filters) is a condition
        of the same statement, before its ``LIMIT``."""
        terms = keyword_terms(query, language)
        if not terms or (documents is not None and not documents):
            return []
        only = "" if documents is None else "AND n.document_id = ANY(%s::uuid[]) "
        # Each term becomes its own lexeme list; plainto_tsquery applies the same stemming and
        # stop words as the index, and the lists are OR-ed together. A lone CJK character is a
        # prefix query (``:*``) over the CJK bigrams (retrieval.text.is_lone_cjk). MATERIALIZED
        # builds the tsquery once: inlined, a plan chosen on missing statistics (a fresh table)
        # rebuilt it for every candidate row (minutes for a few hundred rows).
        sql = (
            "WITH q AS MATERIALIZED (SELECT to_tsquery('english', string_agg("
            "CASE WHEN prefix THEN pq::text || ':*' ELSE pq::text END, ' | ')) AS query "
            "FROM (SELECT plainto_tsquery('english', t) AS pq, prefix "
            "FROM unnest(%s::text[], %s::boolean[]) AS u(t, prefix)) s "
            "WHERE pq::text <> '') "
            f"SELECT k.node_id, ts_rank_cd(k.tsv, q.query) AS score FROM {TABLE} k "
            "CROSS JOIN q "
            "JOIN ingestion_knowledgenode n ON n.id = k.node_id "
            "JOIN ingestion_document d ON d.id = n.document_id "
            "WHERE q.query IS NOT NULL AND k.tsv @@ q.query AND k.space_id = %s "
            f"AND d.active_generation = n.generation AND d.enabled {only}"
            "ORDER BY score DESC LIMIT %s"
        )
        params: list = [terms, [is_lone_cjk(t) for t in terms], space_id]
        if documents is not None:
            params.append([str(d) for d in documents])
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, limit])
            return [ScoredNode(row[0], float(row[1])) for row in cursor.fetchall()]
