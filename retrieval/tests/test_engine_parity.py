"""Engine parity of the keyword leg and fusion: PostgreSQL's BM25 impact lists
(:mod:`retrieval.backends.pgkeyword`) against SQLite's tantivy index over the same nodes.

PostgreSQL only (skipped with the reason on SQLite): the space is compiled on PostgreSQL, then
the SQLite leg's tantivy index of the same space is built from the same rows
(:func:`retrieval.keyword_index.maintenance.rebuild`: the index lives in files, beside any
database), so both legs answer the same query over the same nodes and statistics, and both are
fused with the same dense hits. The documented differences (docs/retrieval.md, "The PostgreSQL
keyword leg"): PostgreSQL's english stop words (``when``, ``once``, ``very``… are dropped from
the index, tantivy keeps them), its stemmer, and tantivy's one-byte length norms; the queries
below avoid the first two, so the rankings must be equal and the scores close.
"""

from __future__ import annotations

import pytest
from django.db import connection

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends.sqlite import SQLiteSearchBackend
from retrieval.keyword_index import maintenance
from retrieval.recall import fuse, min_max, recall, resolve_snapshot

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="compares PostgreSQL's keyword leg with SQLite's (run under scripts/with_postgres.py)",
)

# Two short documents and a longer guide whose sections repeat their shared words.
QUOTA = "Quota: a tenant may store 500 files; uploads over the quota are refused."
RETENTION = "Retention: deleted files are purged from storage after 30 days."
GUIDE = "\n\n".join(
    [
        "# Operator guide",
        "## Uploads\n\n"
        + "An upload sends a file. Each upload of a file is checked, and the file upload is "
        "stored as a file. " * 3,
        "## Storage\n\n"
        + "Stored files stay in storage; a file in storage is read when the file is compiled. " * 3,
        "## Deletion\n\n"
        + "Deleting a file removes the file and every chunk of the file from the search legs. " * 3,
    ]
)
QUERIES = [
    "file upload quota",
    "quota for uploaded files",
    "file retention days",
    "how many files may a tenant store",
    "purged files storage",
    "deleted files purged",
]


@pytest.mark.django_db
def test_keyword_leg_and_fusion_rank_like_sqlite_on_three_documents(space):
    for name, text in (("quota.txt", QUOTA), ("retention.txt", RETENTION), ("guide.md", GUIDE)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    assert maintenance.rebuild(space.id) > 0  # tantivy over the same nodes
    tantivy = SQLiteSearchBackend()
    snapshot = resolve_snapshot(space)
    for query in QUERIES:
        legs, _ = recall(space, snapshot, query, depth=20)
        postgres = legs["keyword"]
        sqlite = tantivy.keyword_search(space.id, query, 20, head_revision=snapshot.head_revision)
        # The same hits; in the same order up to near ties (0.02 of the normalised range:
        # tantivy's one-byte length norms), scores close once normalised as fusion sees them.
        assert {h.node_id for h in postgres} == {h.node_id for h in sqlite}, query
        pg_norm, sq_norm = min_max(postgres), min_max(sqlite)
        assert_same_order([h.node_id for h in postgres], sq_norm, query)
        assert max(abs(pg_norm[n] - sq_norm[n]) for n in pg_norm) < 0.05, (query, pg_norm, sq_norm)
        fused_pg = fuse(legs)
        fused_sq = {n: score for n, score, _ in fuse({"dense": legs["dense"], "keyword": sqlite})}
        assert_same_order([n for n, _, _ in fused_pg], fused_sq, query)
        top = max(fused_sq, key=fused_sq.get)
        both = {h.node_id for h in postgres} & {h.node_id for h in legs["dense"]}
        if top in both:  # a chunk both legs hit, first on SQLite, is first here too
            assert fused_pg[0][0] == top, query


def assert_same_order(order: list, scores: dict, query: str, tie: float = 0.02) -> None:
    """``order`` (best first) never puts an item below one that ``scores`` ranks higher by more
    than ``tie``."""
    for i, better in enumerate(order):
        for worse in order[i + 1 :]:
            assert scores[worse] <= scores[better] + tie, (query, order, scores)
