"""SQLite search backend: FTS5 with BM25 (Porter stemming) for the keyword leg.

The FTS5 table ``retrieval_keyword_fts`` is created by migration ``retrieval.0002``. FTS5's
``bm25()`` (its default ``rank``) uses k1 = 1.2, b = 0.75 and returns lower-is-better values; we
negate it.
"""

from __future__ import annotations

import json
import uuid

from django.db import connection

from retrieval.text import is_lone_cjk, keyword_terms, keyword_text

from .base import IndexedNode, ScoredNode, SearchBackend

TABLE = "retrieval_keyword_fts"


def _hex(value: uuid.UUID) -> str:
    return value.hex  # Django stores UUIDField as 32 hex characters on SQLite


class SQLiteSearchBackend(SearchBackend):
    def _index_keywords(self, nodes: list[IndexedNode]) -> None:
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {TABLE} (text, node_id, space_id, document_id) "
                "VALUES (%s, %s, %s, %s)",
                [
                    (keyword_text(n.text), _hex(n.id), _hex(n.space_id), _hex(n.document_id))
                    for n in nodes
                ],
            )

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:
        # node_id is an indexed FTS5 column: a MATCH on it is an index lookup.
        with connection.cursor() as cursor:
            for start in range(0, len(node_ids), 200):
                tokens = " OR ".join(f'"{_hex(i)}"' for i in node_ids[start : start + 200])
                cursor.execute(
                    f"DELETE FROM {TABLE} WHERE {TABLE} MATCH %s", [f"node_id : ({tokens})"]
                )

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM {TABLE} WHERE {TABLE} MATCH %s",
                [f'space_id : "{_hex(space_id)}"'],
            )
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
        """Top ``limit`` visible nodes by BM25.

        FTS5 ranks the space's matching rows first (``ORDER BY rank LIMIT`` lets it skip the joins
        for every match); rows of unpublished or superseded generations are then removed, and the
        window grows until ``limit`` visible rows are found or the matches run out. ``documents``
        (filters) is a condition of the same statement, so the limit counts allowed rows only.
        """
        terms = keyword_terms(query, language)
        if not terms or (documents is not None and not documents):
            return []
        # A lone CJK character is a prefix query over the CJK bigrams (retrieval.text).
        words = " OR ".join(
            '"' + t.replace('"', '""') + '"' + ("*" if is_lone_cjk(t) else "") for t in terms
        )
        # The space restriction is part of the MATCH (space_id is an indexed column), so only
        # the space's rows are ranked. FTS5's hidden ``rank`` column (bm25 by default) sorts
        # faster than ``bm25()`` in the select list (docs/benchmarks.md).
        match = f'text : ({words}) AND space_id : "{_hex(space_id)}"'
        params: list = [match]
        only = ""
        if documents is not None:
            only = " AND document_id IN (SELECT value FROM json_each(%s))"
            params.append(json.dumps(sorted(_hex(d) for d in documents)))
        sql = (
            f"SELECT node_id, rank FROM {TABLE} WHERE {TABLE} MATCH %s{only} ORDER BY rank LIMIT %s"
        )
        window = limit * 2
        while True:
            with connection.cursor() as cursor:
                cursor.execute(sql, [*params, window])
                rows = cursor.fetchall()
            hits = [ScoredNode(uuid.UUID(node_id), -float(rank)) for node_id, rank in rows]
            visible = self.visible_node_ids([h.node_id for h in hits])
            found = [h for h in hits if h.node_id in visible]
            if len(found) >= limit or len(rows) < window:
                return found[:limit]
            window *= 4
