"""The dense matrix's HNSW graph (retrieval.backends.dense_graph) on SQLite: built past
``KNOWLEDGE_DENSE_GRAPH_MIN_ROWS``, kept current by refreshes, rebuilt after a compaction, and
answering what the exact scan answers on small spaces (every search is compared with numpy over
the rows visible in the database, as in test_dense_matrix)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from django.db import connection

from ingestion.models import KnowledgeNode
from retrieval.backends import dense_graph
from retrieval.backends import dense_matrix as dm
from retrieval.index_versions import ensure_active_version
from retrieval.tests.test_dense_matrix import Corpus, assert_all_exact, assert_exact

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the in-process matrix serves SQLite (PostgreSQL's dense leg is pgvector)",
)

DIM = 8


@pytest.fixture
def graphed(space, settings, monkeypatch):
    """A corpus whose matrix builds its graph past 30 rows, inline; graph searches counted."""
    settings.KNOWLEDGE_DENSE_GRAPH_MIN_ROWS = 30
    ensure_active_version(space, default_model=SimpleNamespace(model_id="t", dimension=DIM))
    corpus = Corpus(space, seed=11)
    backend = corpus.backend
    monkeypatch.setattr(backend, "dense_compact_in_background", False)
    monkeypatch.setattr(backend, "dense_compact_min_rows", 1)
    monkeypatch.setattr(backend, "dense_compact_fraction", 0.2)
    calls = []
    real = dense_graph.DenseGraph.candidates

    def counted(self, *args, **kwargs):
        found = real(self, *args, **kwargs)
        calls.append(len(found))
        return found

    monkeypatch.setattr(dense_graph.DenseGraph, "candidates", counted)
    corpus.graph_calls = calls
    return corpus


def matrix_of(corpus):
    return corpus.backend._dense_matrices[(corpus.space.id, 1)]


def test_the_graph_answers_as_the_exact_scan_through_every_change(graphed):
    corpus = graphed
    docs = [corpus.publish(chunks=6) for _ in range(30)]  # 180 rows
    queries = corpus.vectors(8)

    def check_all():
        assert_all_exact(corpus, queries, (1, 7, 30), docs)

    check_all()
    matrix = matrix_of(corpus)
    assert matrix.graph is not None and matrix.graph.size == matrix.view.count == 180
    used = len(corpus.graph_calls)
    assert used >= 2 * len(queries)  # limits 1 and 7 at least went through the graph
    staged = corpus.republish(docs[0], chunks=3)  # not yet visible
    check_all()
    corpus.activate(docs[0], staged)  # the next refresh adds the 3 rows to the graph
    check_all()
    assert matrix.graph.size == matrix.view.count == 183
    corpus.set_enabled(docs[1], False)  # masked rows are left out inside the graph walk
    check_all()
    corpus.set_enabled(docs[1], True)
    check_all()
    for d in docs[3:12]:  # 54 of 183 rows dead: a compaction moves the positions
        corpus.delete(d)
    check_all()
    nodes = list(KnowledgeNode.objects.filter(document=docs[20]).values_list("id", flat=True))
    corpus.reembed(nodes[:2])
    check_all()
    stats = corpus.backend.dense_stats(corpus.space.id, 1)
    assert stats["compactions"] >= 1
    assert stats["graph_builds"] >= 2  # the first, and one of the compacted epoch
    assert matrix.graph.epoch == matrix.view.epoch and stats["graph_rows"] == stats["rows"]
    assert len(corpus.graph_calls) > used


def test_below_the_threshold_every_search_is_exact(space, settings):
    settings.KNOWLEDGE_DENSE_GRAPH_MIN_ROWS = 1000
    ensure_active_version(space, default_model=SimpleNamespace(model_id="t", dimension=DIM))
    corpus = Corpus(space, seed=12)
    for _ in range(10):
        corpus.publish(chunks=6)
    assert_exact(corpus, corpus.vectors(1)[0], 5)
    assert matrix_of(corpus).graph is None
    assert corpus.backend.dense_stats(corpus.space.id, 1)["graph_rows"] == 0


def test_a_search_widens_its_candidates_past_invisible_rows(graphed):
    corpus = graphed
    docs = [corpus.publish(chunks=6) for _ in range(20)]  # 120 rows
    query = corpus.vectors(1)[0]
    assert_exact(corpus, query, 3)
    # disable the documents of the query's 15 nearest rows: the first candidates are all
    # invisible the first time they are seen
    first = [h.node_id for h in corpus.search(query, 15)]
    owners = set(KnowledgeNode.objects.filter(id__in=first).values_list("document", flat=True))
    for d in docs:
        if d.id in owners:
            corpus.set_enabled(d, False)
    hits = assert_exact(corpus, query, 3)
    assert not {h.node_id for h in hits} & set(first)


def test_graph_recall_on_clustered_vectors():
    """Near-copies (the scale curve's shape): the graph's top 10, rescored, against numpy."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(200, 32)).astype(np.float32)
    rows = np.repeat(centres, 20, axis=0) + rng.normal(scale=0.05, size=(4000, 32))
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    graph = dense_graph.DenseGraph.build(rows, len(rows), epoch=0)
    assert graph.size == 4000
    queries = rows[rng.choice(4000, 50, replace=False)] + rng.normal(scale=0.05, size=(50, 32))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    found = 0
    for q in queries:
        truth = set(np.argsort(-(rows @ q))[:10].tolist())
        candidates = graph.candidates(q, 20, None, ef=400)
        best = candidates[np.argsort(-(rows[candidates] @ q))][:10]
        found += len(truth & set(best.tolist()))
    assert found / (10 * len(queries)) >= 0.99
    mask = np.zeros(4000, np.uint8)
    mask[::2] = 1  # 2,000 rows masked, more than k: kept out of the walk by the bitmap
    picked = graph.candidates(queries[0], 50, mask, ef=400, masked=2000)
    assert len(picked) == 50 and all(p % 2 == 1 for p in picked.tolist())
    best = np.argsort(-(rows @ queries[1]))[:3]
    mask = np.zeros(4000, np.uint8)
    mask[best] = 1  # 3 masked, at most k: the walk returns k + 3 and drops them
    picked = graph.candidates(queries[1], 10, mask, ef=400, masked=3)
    assert len(picked) == 10 and not set(picked.tolist()) & set(best.tolist())


def test_a_graph_ahead_of_the_searchs_view_returns_only_the_views_rows():
    """A refresh may add rows to the graph after a search took its view (and its mask)."""
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(600, 16)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    graph = dense_graph.DenseGraph.build(rows, 400, epoch=0)
    graph.extend(rows, 600)  # the refresh's rows: positions 400..599
    query = rows[450]  # its best match is a row the old view does not hold
    mask = np.zeros(400, np.uint8)  # the old view's mask covers 400 rows
    mask[3] = 1
    for masked in (1, 200):  # dropped after the walk; kept out by the bitmap
        picked = graph.candidates(query, 20, mask, ef=400, masked=masked)
        assert len(picked) and picked.max() < 400 and 3 not in picked.tolist()


@pytest.fixture
def corpus(space):
    ensure_active_version(space, default_model=SimpleNamespace(model_id="t", dimension=DIM))
    return Corpus(space, seed=21)


def test_tied_rows_through_the_graph_are_ordered_as_the_exact_scan(corpus, settings):
    """180 identical rows (boilerplate chunks): the walk reaches only some of them, so a tie at
    the cut sends the search to the exact scan, which orders ties by node id."""
    settings.KNOWLEDGE_DENSE_GRAPH_MIN_ROWS = 30
    same = corpus.vectors(1)[0]
    real = corpus.vectors
    corpus.vectors = lambda n: np.repeat(same[None, :], n, axis=0)  # boilerplate chunks
    for _ in range(30):
        corpus.publish(chunks=6)  # 180 identical rows
    corpus.vectors = real
    for _ in range(10):
        corpus.publish(chunks=6)
    corpus.search(same, 1)  # the first read starts the build (a background thread: wait)
    matrix = corpus.backend._dense_matrices[(corpus.space.id, 1)]
    for _ in range(100):
        if matrix.graph is not None:
            break
        time.sleep(0.05)
    assert matrix.graph is not None
    assert_exact(corpus, same, 5)  # the 5 smallest node ids of the 180 tied rows


def test_a_failed_build_is_not_retried_on_every_refresh(corpus, settings, monkeypatch):
    """A failed build waits for a new epoch or twice the rows before the next attempt."""
    settings.KNOWLEDGE_DENSE_GRAPH_MIN_ROWS = 30
    monkeypatch.setattr(corpus.backend, "dense_compact_in_background", False)  # inline builds
    calls = []

    def failing(cls, matrix, count, epoch):
        calls.append(count)
        raise MemoryError("faiss: cannot allocate")  # e.g. the graph does not fit

    monkeypatch.setattr(dense_graph.DenseGraph, "build", classmethod(failing))
    for _ in range(6):
        corpus.publish(chunks=6)
    query = corpus.vectors(1)[0]
    for _ in range(10):
        corpus.publish(chunks=1)
        assert_exact(corpus, query, 3)  # each search refreshes: each refresh builds again
    assert len(calls) <= 2, f"{len(calls)} full builds attempted for rows {calls}"


def test_a_build_across_a_cold_reread_is_not_installed(corpus, monkeypatch):
    """A whole re-read (a non-incremental matrix) is a new epoch: a graph of the previous read's
    positions, still building, is not installed on it."""
    gate = threading.Event()
    real = dense_graph.DenseGraph.build.__func__

    def slow(cls, matrix, count, epoch):
        gate.wait(10)
        return real(cls, matrix, count, epoch)

    monkeypatch.setattr(dense_graph.DenseGraph, "build", classmethod(slow))
    docs = [corpus.publish(chunks=6) for _ in range(20)]  # 120 rows
    matrix = dm.DenseMatrix(corpus.space.id, 1, DIM, incremental=False, graph_min_rows=30)
    with matrix.lock:
        matrix.refresh(corpus.head())  # starts the background build of this read
    assert matrix.graph_building
    for d in docs[:10]:  # the first 60 rows go: every later row moves 60 positions up
        corpus.delete(d)
    for _ in range(10):
        corpus.publish(chunks=6)
    with matrix.lock:
        matrix.refresh(corpus.head())  # a cold re-read (non-incremental): a new epoch
    gate.set()
    for _ in range(200):
        if not matrix.graph_building:
            break
        time.sleep(0.05)
    graph = matrix.graph
    view = matrix.view
    assert graph is None or graph.epoch == view.epoch
    # the graph's vector at each position should be the view's row there
    wrong = (
        0
        if graph is None
        else sum(
            not np.allclose(graph.index.reconstruct(p), view.matrix[p], atol=0.05)
            for p in range(view.count)
        )
    )
    assert wrong == 0, (
        f"graph epoch {graph.epoch} installed on view epoch {view.epoch}: "
        f"{wrong} of {view.count} positions hold another row's vector"
    )


def test_only_one_build_at_a_time(corpus, monkeypatch):
    """A build that finds the rows compacted meanwhile decides its restart under the matrix's
    lock, so a refresh at that moment does not start a second build."""
    gate = threading.Event()
    running, peak, running_epochs = [0], [0], []
    lock = threading.Lock()
    real_build = dense_graph.DenseGraph.build.__func__
    real_due = dense_graph.due

    def counted(cls, matrix, count, epoch):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if not running_epochs:
                running_epochs.append(epoch)
                gate.wait(10)
            else:
                time.sleep(0.5)
            return real_build(cls, matrix, count, epoch)
        finally:
            with lock:
                running[0] -= 1

    def slow_due(matrix, view):
        # widen the window between the build thread's check and its start_build
        verdict = real_due(matrix, view)
        if threading.current_thread().name == "dense-graph":
            time.sleep(0.3)  # between the check and start_build setting graph_building
        return verdict

    monkeypatch.setattr(dense_graph.DenseGraph, "build", classmethod(counted))
    monkeypatch.setattr(dense_graph, "due", slow_due)
    for _ in range(20):
        corpus.publish(chunks=6)
    matrix = dm.DenseMatrix(corpus.space.id, 1, DIM, graph_min_rows=30, compact_min_rows=1)
    with matrix.lock:
        matrix.refresh(corpus.head())  # build 1 (epoch 0), held at the gate
        view = matrix.view
        view.mask[:40] = dm.DEAD
        matrix.dead_count = 40
    matrix._compact()  # epoch 1: no build now (one is running)
    assert matrix.view.epoch == running_epochs[0] + 1 and matrix.graph_building
    gate.set()  # build 1 sees the new epoch, clears graph_building, then decides to restart
    time.sleep(0.1)
    with matrix.lock:  # a refresh's after_refresh meanwhile
        dense_graph.after_refresh(matrix, matrix.view)
    time.sleep(2)
    assert peak[0] == 1, f"{peak[0]} graph builds ran at once"


def test_graph_candidates_under_concurrent_extend():
    """Four threads search the graph (both mask paths) while a writer extends it."""
    rng = np.random.default_rng(1)
    n, d = 40000, 32
    rows = rng.normal(size=(n, d)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    graph = dense_graph.DenseGraph.build(rows, 5000, epoch=0)
    errors = []
    stop = threading.Event()

    def reader(seed):
        r = np.random.default_rng(seed)
        while not stop.is_set():
            size = graph.size
            mask = (r.random(size) < r.choice([0.001, 0.5])).astype(np.uint8)
            masked = int(mask.sum())
            q = rows[r.integers(n)]
            try:
                found = graph.candidates(q, 20, mask, ef=200, masked=masked)
                assert (found < size).all() and (found >= 0).all()
                assert not mask[found].any()
                assert len(set(found.tolist())) == len(found)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                return

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for end in range(6000, n + 1, 1000):
        graph.extend(rows, end)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert graph.size == graph.index.ntotal == n
