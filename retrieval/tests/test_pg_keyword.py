"""The PostgreSQL keyword leg: exact BM25 top-k by the Threshold Algorithm over impact lists.

PostgreSQL only (skipped with the reason on SQLite). Corpora are written straight into the
tables (documents, nodes, then the backend's own ``index_keywords``) from a seeded Zipf
vocabulary, so a few thousand nodes take seconds; the reference is a brute-force BM25 in Python
over every node, from lexemes PostgreSQL's english configuration gives (``unnest(to_tsvector)``),
with the same statistics (N, df, average length over every indexed node) and the same
summation order (terms sorted), so equal scores are equal floats and ties go by node id.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import uuid

import pytest
from django.db import connection, connections, transaction

from ingestion.models import Document, DocumentState, KnowledgeNode
from knowledgefs.testing.rows import published_document
from retrieval.backends import IndexedNode, get_search_backend, threshold
from retrieval.backends import pgkeyword as pk
from retrieval.text import keyword_terms, keyword_text

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the impact lists are PostgreSQL's keyword leg (run under scripts/with_postgres.py)",
)

# Words PostgreSQL's english configuration stems together (and stop words it drops).
ENGLISH = "running runs run runner cells cell cellular patients patient the of and with".split()


def vocabulary(size: int) -> list[str]:
    return ENGLISH + [f"w{i:04d}" for i in range(size)]


def zipf_words(rng: random.Random, words: list[str], count: int) -> list[str]:
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(len(words))]
    return rng.choices(words, weights=weights, k=count)


def fill(space, *, documents: int, per_document: int, seed: int) -> dict:
    """Published documents of seeded Zipf texts; every 7th document disabled, every 5th has a
    second, superseded generation of nodes (indexed, never visible), every 11th node repeats
    another's text (ties). Returns ``{"docs": [ids], "visible": {node: document}}``."""
    rng = random.Random(seed)
    words = vocabulary(400)
    docs, nodes, visible, texts = [], [], {}, []
    for d in range(documents):
        active, old = uuid.uuid4(), uuid.uuid4()
        doc = published_document(
            space, f"doc-{d}", generation=active, node_count=per_document, enabled=d % 7 != 3
        )
        docs.append(doc)
        generations = [active, old] if d % 5 == 0 else [active]
        for generation in generations:
            for c in range(per_document):
                if texts and rng.random() < 1 / 11:
                    text = rng.choice(texts)
                else:
                    text = " ".join(zipf_words(rng, words, rng.randint(3, 40)))
                texts.append(text)
                node = KnowledgeNode(
                    id=uuid.uuid4(),
                    space=space,
                    document=doc,
                    generation=generation,
                    chunk_index=c,
                    text=text,
                    start_offset=0,
                    end_offset=len(text),
                )
                nodes.append(node)
                if generation == active and doc.enabled:
                    visible[node.id] = doc.id
    Document.objects.bulk_create(docs, batch_size=500)
    KnowledgeNode.objects.bulk_create(nodes, batch_size=1000)
    get_search_backend().index_keywords(
        [IndexedNode(n.id, space.id, n.document_id, n.text) for n in nodes]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {pk.POSTING}")
    return {"docs": [d.id for d in docs], "visible": visible}


class BruteForce:
    """BM25 over every indexed node of a space, recomputed from the node texts."""

    def __init__(self, space) -> None:
        self.postings: dict[uuid.UUID, dict[str, int]] = {}
        rows = KnowledgeNode.objects.filter(space=space).values_list("id", "text")
        with connection.cursor() as cursor:
            for node_id, text in rows:
                cursor.execute(
                    "SELECT lexeme, cardinality(positions) FROM unnest(to_tsvector('english', %s))",
                    [keyword_text(text)],
                )
                self.postings[node_id] = dict(cursor.fetchall())
        self.lengths = {n: sum(p.values()) for n, p in self.postings.items()}
        self.n = len(self.postings)
        self.avgdl = sum(self.lengths.values()) / self.n
        self.df: dict[str, int] = {}
        for p in self.postings.values():
            for term in p:
                self.df[term] = self.df.get(term, 0) + 1

    def lexemes(self, query: str) -> list[str]:
        found: set[str] = set()
        with connection.cursor() as cursor:
            for term in keyword_terms(query):
                cursor.execute("SELECT lexeme FROM unnest(to_tsvector('english', %s))", [term])
                found |= {row[0] for row in cursor.fetchall()}
        return sorted(t for t in found if t in self.df)

    def top(self, query: str, k: int, allowed: set[uuid.UUID]) -> list[tuple[uuid.UUID, float]]:
        terms = self.lexemes(query)
        scores = {}
        for node in allowed:
            p, dl, total, hit = self.postings[node], self.lengths[node], 0.0, False
            for t in terms:
                tf = p.get(t)
                if tf:
                    hit = True
                    ratio = (self.n - self.df[t] + 0.5) / (self.df[t] + 0.5)
                    idf = max(math.log(ratio), 0.01 * math.log1p(ratio))  # FTS5's, floored
                    norm = tf + 1.2 * (1 - 0.75 + 0.75 * dl / self.avgdl)
                    total += idf * tf * 2.2 / norm
            if hit:
                scores[node] = total
        return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def search(space, query, k, documents=None, trace=None):
    hits = get_search_backend().keyword_search(space.id, query, k, documents=documents, trace=trace)
    return [(h.node_id, h.score) for h in hits]


def same(got, want):
    assert [n for n, _ in got] == [n for n, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, rel=1e-9)


def queries(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = vocabulary(400)
    return [" ".join(zipf_words(rng, words, rng.randint(1, 6))) for _ in range(count)]


def test_threshold_top_k_equals_brute_force_bm25_over_visible_nodes(space, monkeypatch):
    corpus = fill(space, documents=300, per_document=10, seed=1)
    reference = BruteForce(space)
    assert reference.n == 3600  # 300 × 10 active + 60 × 10 superseded, all indexed
    visible = set(corpus["visible"])
    traces = []
    for query in queries(2, 40):
        for k in (1, 10, 50):
            trace: dict = {}
            same(search(space, query, k, trace=trace), reference.top(query, k, visible))
            traces.append(trace)
    assert {t["path"] for t in traces} == {"threshold"}
    assert all(t["exact"] for t in traces)  # these lists are short: proved within the budget
    # The bound prunes: on average far fewer postings read than the lists hold.
    assert sum(t["resolved"] for t in traces) < 0.5 * len(traces) * len(visible)
    # A documents filter, answered directly (few nodes) and by the threshold algorithm.
    allowed_docs = frozenset(corpus["docs"][::3])
    allowed = {n for n, d in corpus["visible"].items() if d in allowed_docs}
    for query in queries(3, 15):
        trace = {}
        same(search(space, query, 10, allowed_docs, trace), reference.top(query, 10, allowed))
        assert trace["path"] == "direct"
    monkeypatch.setattr(pk, "DIRECT_FILTER_NODES", 0)
    for query in queries(4, 15):
        trace = {}
        same(search(space, query, 10, allowed_docs, trace), reference.top(query, 10, allowed))
        assert trace["path"] == "threshold"


def test_a_flat_query_reads_at_most_its_postings_budget(space, monkeypatch):
    """Common terms of a Zipf corpus make long, flat lists: past the (here shrunk) budget the
    leg stops reading and answers with its best resolved candidates — ``k`` visible nodes, each
    with its exact BM25 score, best first, the documents filter applied before the limit."""
    corpus = fill(space, documents=300, per_document=10, seed=11)
    reference = BruteForce(space)
    visible = set(corpus["visible"])
    exact = {n: s for n, s in reference.top("w0000 w0001 w0002 cells running", 10**6, visible)}
    trace: dict = {}
    unbounded = search(space, "w0000 w0001 w0002 cells running", 10, trace=trace)
    assert trace["exact"] and trace["postings"] > 256
    monkeypatch.setattr(threshold, "POSTINGS_BUDGET_MIN", 256)
    monkeypatch.setattr(threshold, "POSTINGS_PER_RESULT", 1)
    trace = {}
    hits = search(space, "w0000 w0001 w0002 cells running", 10, trace=trace)
    assert trace["budget"] == 256 and trace["postings"] <= 256 and trace["exact"] is False
    assert len(hits) == 10 and {n for n, _ in hits} <= visible
    for node, score in hits:
        assert score == pytest.approx(exact[node], rel=1e-9)
    assert hits == sorted(hits, key=lambda h: (-h[1], h[0]))
    assert len({n for n, _ in hits} & {n for n, _ in unbounded}) >= 1
    monkeypatch.setattr(pk, "DIRECT_FILTER_NODES", 0)
    allowed_docs = frozenset(corpus["docs"][::3])
    trace = {}
    hits = search(space, "w0000 w0001 w0002 cells running", 10, allowed_docs, trace)
    assert trace["path"] == "threshold" and len(hits) == 10
    assert all(corpus["visible"][n] in allowed_docs for n, _ in hits)


def test_stemming_stop_words_and_ties_follow_the_english_configuration(space):
    texts = ["Running patients", "runs patient", "the of and", "patients running", "cellular"]
    fill_texts(space, texts)
    hits = search(space, "the runner patients", 10)
    # "the" is a stop word; runner → runner (its own lexeme), patients → patient, running → run.
    # All three patient texts hold the lexemes {run, patient}: one score, ties by node id.
    assert len(hits) == 3 and len({score for _, score in hits}) == 1
    assert [n for n, _ in hits] == sorted(n for n, _ in hits)
    assert [n for n, _ in search(space, "runner running", 10)] == sorted(
        n for n, _ in hits
    )  # running → run: the same three
    assert search(space, "the of and", 10) == []  # english drops every stop word


def test_control_characters_and_empty_texts_keep_term_vectors_exact(space):
    """The node insert joins a node's lexemes with U+001F; PostgreSQL's parser splits on control
    characters, so none reaches a lexeme, and a text without lexemes gets an empty vector."""
    ids = fill_texts(
        space, ["alpha\x1fbeta gamma\x1f\x1fdelta", "\x1f\x1e\t", "the of and", "w9 w9"]
    )
    term_vectors_match_postings(space.id)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT node_id, terms, tfs FROM {pk.NODE} WHERE node_id = ANY(%s)", [ids])
        vectors = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    assert vectors[ids[0]] == (["alpha", "beta", "delta", "gamma"], [1, 1, 1, 1])
    assert vectors[ids[1]] == vectors[ids[2]] == ([], [])
    assert vectors[ids[3]] == (["w9"], [2])
    assert [n for n, _ in search(space, "beta delta", 10)] == [ids[0]]


def fill_texts(space, texts: list[str]) -> list[uuid.UUID]:
    generation = uuid.uuid4()
    doc = Document.objects.create(
        tenant_id=space.tenant_id,
        space=space,
        filename="t.txt",
        mime_type="text/plain",
        size_bytes=1,
        sha256=hashlib.sha256(str(uuid.uuid4()).encode()).hexdigest(),
        storage_key=f"test/{uuid.uuid4()}",
        state=DocumentState.PUBLISHED,
        active_generation=generation,
        node_count=len(texts),
    )
    nodes = KnowledgeNode.objects.bulk_create(
        KnowledgeNode(
            id=uuid.uuid4(),
            space=space,
            document=doc,
            generation=generation,
            chunk_index=i,
            text=t,
            start_offset=0,
            end_offset=len(t),
        )
        for i, t in enumerate(texts)
    )
    get_search_backend().index_keywords(
        [IndexedNode(n.id, space.id, doc.id, n.text) for n in nodes]
    )
    return [n.id for n in nodes]


def statistics(space_id) -> tuple[tuple, dict]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nodes, length FROM {pk.SPACE} WHERE space_id = %s", [space_id])
        space_row = cursor.fetchone()
        cursor.execute(f"SELECT term, df FROM {pk.TERM} WHERE space_id = %s", [space_id])
        return space_row, dict(cursor.fetchall())


def recomputed(space_id) -> tuple[tuple, dict]:
    """N, Σ length and df counted from the posting and node rows themselves."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*), coalesce(sum(length), 0) FROM {pk.NODE} WHERE space_id = %s",
            [space_id],
        )
        space_row = cursor.fetchone()
        cursor.execute(
            f"SELECT term, count(*) FROM {pk.POSTING} WHERE space_id = %s GROUP BY term",
            [space_id],
        )
        return space_row, dict(cursor.fetchall())


def term_vectors_match_postings(space_id) -> None:
    """Every node row's term vector (``terms``, ``tfs``: what the random access reads) is
    exactly its postings, term by term, ``length`` their Σ tf, and its document and generation
    its knowledge node's."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT k.node_id, k.length, k.terms, k.tfs, "
            "coalesce(array_agg(p.term ORDER BY p.term) FILTER (WHERE p.term IS NOT NULL), "
            "'{}'), coalesce(array_agg(p.tf ORDER BY p.term) FILTER (WHERE p.term IS NOT NULL), "
            f"'{{}}') FROM {pk.NODE} k LEFT JOIN {pk.POSTING} p ON p.node_id = k.node_id "
            "WHERE k.space_id = %s GROUP BY k.node_id",
            [space_id],
        )
        rows = cursor.fetchall()
    assert rows and any(row[2] for row in rows)
    for _, length, terms, tfs, posted_terms, posted_tfs in rows:
        assert (terms, tfs) == (posted_terms, posted_tfs)
        assert length == sum(tfs)
    # … and carries its node's document and generation (what visibility reads).
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*), count(*) FILTER (WHERE k.document_id = n.document_id "
            f"AND k.generation = n.generation) FROM {pk.NODE} k "
            "JOIN ingestion_knowledgenode n ON n.id = k.node_id WHERE k.space_id = %s",
            [space_id],
        )
        joined, same = cursor.fetchone()
    assert joined == same == len(rows)


def test_deletes_keep_statistics_exact_and_rebuild_gives_the_same_answers(space):
    corpus = fill(space, documents=100, per_document=10, seed=5)
    backend = get_search_backend()
    assert statistics(space.id) == recomputed(space.id)
    term_vectors_match_postings(space.id)
    assert (
        backend.projection_counts(space.id)["keyword"]
        == KnowledgeNode.objects.filter(space=space).count()
    )
    gone = list(KnowledgeNode.objects.filter(space=space).values_list("id", flat=True)[::3])
    backend.delete_nodes(gone)
    KnowledgeNode.objects.filter(id__in=gone).delete()
    assert statistics(space.id) == recomputed(space.id)
    (nodes, _), df = statistics(space.id)
    assert nodes == KnowledgeNode.objects.filter(space=space).count()
    assert all(v > 0 for v in df.values())  # a term whose last posting went is gone too
    visible = set(corpus["visible"]) - set(gone)
    reference = BruteForce(space)
    before = {q: search(space, q, 10) for q in queries(6, 20)}
    for query, hits in before.items():
        same(hits, reference.top(query, 10, visible))
    term_vectors_match_postings(space.id)
    assert backend.rebuild_keywords(space.id) == nodes
    assert statistics(space.id) == recomputed(space.id)
    term_vectors_match_postings(space.id)
    for query, hits in before.items():
        same(search(space, query, 10), hits)


def test_the_lists_are_read_by_index_scans_under_a_limit(space):
    fill(space, documents=200, per_document=20, seed=7)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {pk.POSTING}; ANALYZE {pk.NODE}")
        lexemes = pk.query_lexemes(cursor, space.id, ["w0001", "cells", "w0040"], [False] * 3)
        terms = [t for t, _ in lexemes]
        assert terms == ["cell", "w0001", "w0040"]
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + pk.SORTED_SQL,
            [terms, [1e9] * 3, [pk.MAX_UUID] * 3, [50] * 3, space.id],
        )
        sorted_plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            f"SELECT node_id FROM {pk.POSTING} WHERE space_id = %s AND term = 'cell' LIMIT 100",
            [space.id],
        )
        candidates = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "EXPLAIN (COSTS OFF) " + pk.RANDOM_SQL.replace(pk.VISIBLE, pk.VISIBLE.format(only="")),
            [terms, candidates, space.id],
        )
        random_plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Limit" in sorted_plan
    # Index (only) scan backward of each list, under its LIMIT: 50 rows read per list.
    assert "Scan Backward using retrieval_keyword_posting_list" in sorted_plan
    assert "rows=50.00 loops=3" in sorted_plan
    assert "Index Cond: ((space_id = " in sorted_plan and "ROW(impact, node_id) < ROW(" in (
        sorted_plan
    )
    assert "Seq Scan" not in sorted_plan and "Sort" not in sorted_plan
    # Random access: each candidate's node row by its primary key (its term vector holds the
    # tf), no posting read.
    assert "retrieval_keyword_node_pkey" in random_plan
    assert "retrieval_keyword_posting" not in random_plan
    assert "Seq Scan" not in random_plan


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_into_one_space_lose_no_counts(space):
    """Two sessions index overlapping vocabularies into one (new) space at once, committing
    separately: N, Σ length and every df equal what the rows themselves count."""
    space_id = uuid.uuid4()
    rng = random.Random(8)
    words = vocabulary(50)
    batches = [
        [
            IndexedNode(uuid.uuid4(), space_id, uuid.uuid4(), " ".join(zipf_words(rng, words, 20)))
            for _ in range(150)
        ]
        for _ in range(4)
    ]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(mine):
        try:
            start.wait()
            for batch in mine:
                with transaction.atomic():
                    get_search_backend().index_keywords(batch)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(batches[i::2],)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        (nodes, length), df = statistics(space_id)
        assert (nodes, length) == recomputed(space_id)[0]
        assert nodes == 600
        assert df == recomputed(space_id)[1]
        backend = get_search_backend()
        backend.delete_nodes([n.id for b in batches for n in b])
        assert statistics(space_id) == ((0, 0), {})
    finally:
        with connection.cursor() as cursor:
            for table in (pk.POSTING, pk.NODE, pk.TERM, pk.SPACE):
                cursor.execute(f"DELETE FROM {table} WHERE space_id = %s", [space_id])
