"""SQLite search backend: the keyword leg on per-space tantivy indexes (BM25, block-max WAND).

The indexes live under ``KNOWLEDGE_VAR_DIR/search/keyword/`` (:mod:`retrieval.keyword_index`);
the database stays the source of truth and an index is rebuilt from it (``kfs reindex``, the
recovery sweep). Writes run inside the caller's database transaction and commit the index right
before returning, so a failed index commit rolls the stage back, and a crash after it leaves
only documents no query can see (their nodes never committed). The dense leg is the portable
exact search of :class:`~.base.SearchBackend`.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

from ingestion.models import KnowledgeNode
from retrieval.keyword_index import analysis, maintenance, store
from retrieval.text import keyword_text
from spaces.models import PublicationHead

from .base import IndexedNode, ScoredNode, SearchBackend, uuid_of_hex
from .dense_sql import visible_hex
from .head_verdicts import HeadVerdicts

DELETE_LOOKUP_BATCH = 500
#: Hits the keyword leg takes past its limit in its first window (invisible ones are dropped).
WINDOW_SLACK = 10


class SQLiteSearchBackend(SearchBackend):
    def __init__(self) -> None:
        super().__init__()
        # The keyword leg's visibility verdicts, per space, for one publication head.
        self.keyword_verdicts = HeadVerdicts(visible_hex)

    def _index_keywords(self, nodes: list[IndexedNode]) -> None:
        """Upsert each node (delete by ``node_id``, then add): a retried stage adds no
        duplicate. One writer and one commit per space."""
        by_space: dict[uuid.UUID, list[IndexedNode]] = defaultdict(list)
        for node in nodes:
            by_space[node.space_id].append(node)
        for space_id, group in by_space.items():
            with store.writer(space_id) as w:
                for n in group:
                    w.delete_documents_by_term("node_id", n.id.hex)
                    w.add_document(analysis.document(n.id, n.document_id, keyword_text(n.text)))

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:
        """Delete by ``node_id`` in the index of each node's space (the nodes still exist)."""
        by_space: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for start in range(0, len(node_ids), DELETE_LOOKUP_BATCH):
            for space_id, node_id in KnowledgeNode.objects.filter(
                id__in=node_ids[start : start + DELETE_LOOKUP_BATCH]
            ).values_list("space_id", "id"):
                by_space[space_id].append(node_id)
        for space_id, ids in by_space.items():
            with store.writer(space_id, create=False) as w:
                if w is None:
                    continue
                for node_id in ids:
                    w.delete_documents_by_term("node_id", node_id.hex)

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:
        return store.num_docs(space_id)

    def keyword_search(
        self,
        space_id: uuid.UUID,
        query: str,
        limit: int,
        *,
        documents: frozenset | None = None,
        language: str | None = None,
        head_revision: int | None = None,
    ) -> list[ScoredNode]:
        """Top ``limit`` visible nodes by BM25.

        Tantivy takes the top ``window`` of the space's index (``documents`` is a clause of the
        query, so the window counts allowed documents only); nodes of unpublished or superseded
        generations and of disabled documents are then removed in SQL (one statement on the
        32-hex node ids, no UUID built for a hit that is dropped; each id is read once per
        publication head, :mod:`.head_verdicts`), and the window grows (×4)
        until ``limit`` visible hits are found or the matches run out: the result is exactly
        the top ``limit`` of the visible nodes. The first window is ``limit`` plus
        :data:`WINDOW_SLACK` (most hits are visible: each hit fetched costs its stored id and a
        row of the visibility statement). ``head_revision`` (the snapshot's
        publication head; read here when ``None``) reloads this process's searcher when the
        head moved. A space whose index is missing while it has published nodes, or cannot be
        opened, raises 503 ``search_backend_unavailable``
        (:class:`~retrieval.keyword_index.store.KeywordIndexUnavailable`).
        """
        if documents is not None and not documents:
            return []
        if head_revision is None:
            head_revision = (
                PublicationHead.objects.filter(space_id=space_id)
                .values_list("revision", flat=True)
                .first()
            )
        index = store.open_index(space_id, head=head_revision)
        if index is None:
            if maintenance.has_published_nodes(space_id):
                raise store.KeywordIndexUnavailable(space_id, "index directory missing")
            return []
        searcher = index.searcher()
        q = analysis.build_query(query, language=language, documents=documents, searcher=searcher)
        if q is None:
            return []
        window = limit + WINDOW_SLACK
        while True:
            rows = searcher.search(q, window, count=False).hits
            hits = [(searcher.doc(address)["node_id"][0], score) for score, address in rows]
            visible = self.keyword_verdicts.visible(
                space_id, head_revision, [node for node, _ in hits]
            )
            found = [(node, score) for node, score in hits if node in visible]
            if len(found) >= limit or len(rows) < window:
                return [ScoredNode(uuid_of_hex(node), score) for node, score in found[:limit]]
            window *= 4
