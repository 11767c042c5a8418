"""Scale curve ``measure``: one size's dense leg alone (and the ``hnsw.ef_search`` sweep on
PostgreSQL) and Fast in-process, with latency percentiles; runs inside a worker subprocess."""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import time

import numpy as np

from .state import DEPTH, EF_SEARCH_SWEEP, TENANT, log, state_dir


# --- measure -------------------------------------------------------------------------------------
def measure_point(engine: str, size: int, count: int, warmup: int, max_seconds: int) -> dict:
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from retrieval.backends import get_search_backend
    from retrieval.modes import retrieve
    from retrieval.recall import resolve_snapshot
    from spaces.models import KnowledgeSpace

    call_command("migrate", verbosity=0)  # the merged branch's migrations, if any are new
    if KEYWORD_VARIANT == "unbounded":  # PostgreSQL's keyword leg without its postings budget
        from retrieval.backends import pgkeyword

        pgkeyword.search = functools.partial(pgkeyword.search, bounded=False)
    prewarmed = prewarm(PREWARM) if engine == "postgres" and PREWARM else {}
    loaded = np.load(state_dir() / "queries.npz", allow_pickle=True)
    texts, vectors = list(loaded["texts"]), loaded["vectors"]
    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=f"scale-{size}")
    backend = get_search_backend()
    snapshot = resolve_snapshot(space)
    number, _, dimension = snapshot.version
    load_start = os.getloadavg()

    def dense(vector):
        return backend.dense_search(
            space.id, vector, index_version=number, head_revision=snapshot.head_revision,
            limit=DEPTH, dimension=dimension,
        )  # fmt: skip

    t0 = time.perf_counter()
    with CaptureQueriesContext(connection) as captured:
        dense(vectors[0])
    cold_ms = (time.perf_counter() - t0) * 1000
    plan = explain_dense(captured.captured_queries) if engine == "postgres" else None
    log(f"  cold dense search {cold_ms:.0f} ms")
    graph = wait_for_graph(backend, space.id, number) if engine == "sqlite" else {}
    extra = texts[count:] or texts
    for text in extra[:warmup]:
        retrieve(space, text, top_k=10, mode="fast")
    fast_ms, bare_ms, stages, dense_ms, dense_ids = [], [], [], [], []
    for vector in vectors[:count]:  # the dense leg first: recall needs every query
        t0 = time.perf_counter()
        hits = dense(vector)
        dense_ms.append((time.perf_counter() - t0) * 1000)
        dense_ids.append([_hex(h.node_id) for h in hits])
    sweep = {}
    if EF_SWEEP and engine == "postgres":
        sweep = ef_search_sweep(dense, vectors[:count])
    elif EF_SWEEP and graph.get("graph_rows"):
        sweep = graph_ef_sweep(backend, space.id, number, dense, vectors[:count])
    deadline = time.monotonic() + max_seconds
    for text in texts[:count]:  # then Fast, bounded by the point's time budget
        if time.monotonic() > deadline:
            log(f"  time budget reached after {len(fast_ms)} Fast queries")
            break
        t0 = time.perf_counter()
        result = retrieve(space, text, top_k=10, mode="fast")
        fast_ms.append((time.perf_counter() - t0) * 1000)
        stages.append(
            {s["name"]: s["duration_ms"] for s in result.stages if s["status"] == "executed"}
        )
        bare_ms.append(fast_ms[-1] - stages[-1].get("embed", 0.0))
    probe = publish_probe(space, texts[count:] or texts) if PUBLISH_PROBES else {}
    return {
        "queries_fast": len(fast_ms),
        "queries_dense": len(dense_ms),
        "fast_p50_ms": pct(fast_ms, 50),
        "fast_p95_ms": pct(fast_ms, 95),
        "fast_mean_ms": round(float(np.mean(fast_ms)), 2) if fast_ms else None,
        # Fast without the query's embedding (the embed stage's time taken off each query).
        "fast_noembed_p50_ms": pct(bare_ms, 50),
        "fast_noembed_p95_ms": pct(bare_ms, 95),
        "after_publish": probe,
        "dense_p50_ms": pct(dense_ms, 50),
        "dense_p95_ms": pct(dense_ms, 95),
        "cold_dense_ms": round(cold_ms, 1),
        "dense_graph": graph,
        "ef_search_configured": _configured_ef(engine),
        "stage_p50_ms": {
            name: pct([s[name] for s in stages if name in s], 50)
            for name in ("embed", "dense", "keyword", "fusion")
        },
        "stage_p95_ms": {
            name: pct([s[name] for s in stages if name in s], 95)
            for name in ("embed", "dense", "keyword", "fusion")
        },
        "keyword_variant": KEYWORD_VARIANT or "default",
        "prewarmed": prewarmed,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fast_ms": [round(v, 2) for v in fast_ms],
        "dense_ms": [round(v, 2) for v in dense_ms],
        "dense_ids": dense_ids,
        "dense_plan": plan,
        "ef_search_sweep": sweep,
    }


PUBLISH_PROBES = int(os.environ.get("KFS_SCALE_PUBLISH_PROBES", "5"))
EF_SWEEP = os.environ.get("KFS_SCALE_EF_SWEEP", "1") != "0"
# ``unbounded``: PostgreSQL's keyword leg without its postings budget (the exact Threshold
# Algorithm, the leg before the budget), recorded as engine ``postgres+unbounded``.
KEYWORD_VARIANT = os.environ.get("KFS_SCALE_KEYWORD", "")
# ``KFS_SCALE_PREWARM=rel,rel,…``: read these relations (tables or indexes) into the operating
# system's cache with pg_prewarm before measuring, as a server that has been answering for a
# while holds what its queries read (a space larger than memory cannot hold all of it).
PREWARM = [r for r in os.environ.get("KFS_SCALE_PREWARM", "").split(",") if r]


def prewarm(relations: list[str]) -> dict:
    """``pg_prewarm(rel, 'read')`` of each relation: ``{rel: {"bytes", "seconds"}}``."""
    from django.db import connection

    out = {}
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        for relation in relations:
            t0 = time.perf_counter()
            cursor.execute("SELECT pg_prewarm(%s::regclass, 'read')", [relation])
            cursor.execute("SELECT pg_relation_size(%s::regclass)", [relation])
            size = cursor.fetchone()[0]
            out[relation] = {"bytes": size, "seconds": round(time.perf_counter() - t0, 1)}
            log(f"  prewarmed {relation}: {size / 2**30:.2f} GiB in {out[relation]['seconds']} s")
    return out


def publish_probe(space, texts: list[str]) -> dict:
    """Publish one more small document ``PUBLISH_PROBES`` times (admitted and compiled in this
    process, the worker's code path) and time the first Fast query after each publication and
    the one after it, query embedding excluded: ``{first_ms, next_ms, first_p50_ms,
    next_p50_ms, publish_s}``."""
    from ingestion.compilation.recovery import drain_queued
    from ingestion.documents import admit_document
    from retrieval.modes import retrieve

    def bare(text: str) -> float:
        t0 = time.perf_counter()
        result = retrieve(space, text, top_k=10, mode="fast")
        total = (time.perf_counter() - t0) * 1000
        embed = sum(s["duration_ms"] for s in result.stages if s["name"] == "embed")
        return round(total - embed, 2)

    first, following, publish_s = [], [], []
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    for i in range(PUBLISH_PROBES):
        body = f"Probe {stamp}-{i}. " + " ".join(texts[(7 * i + j) % len(texts)] for j in range(3))
        t0 = time.perf_counter()
        admit_document(space, filename=f"probe-{stamp}-{i}.md", data=body.encode(), enqueue=False)
        drain_queued()
        publish_s.append(round(time.perf_counter() - t0, 2))
        first.append(bare(texts[(11 * i + 1) % len(texts)]))
        following.append(bare(texts[(11 * i + 2) % len(texts)]))
    log(f"  after publish: first {first} ms, next {following} ms")
    return {
        "first_ms": first,
        "next_ms": following,
        "first_p50_ms": pct(first, 50),
        "next_p50_ms": pct(following, 50),
        "publish_s": publish_s,
    }


def ef_search_sweep(dense, vectors) -> dict:
    """The dense leg alone at other ``KNOWLEDGE_PG_HNSW_EF_SEARCH`` values (the backend reads
    the setting per query; raised to the leg's depth of 50 when smaller): latencies and ids."""
    from django.conf import settings

    configured = settings.KNOWLEDGE_PG_HNSW_EF_SEARCH
    try:
        return _sweep(
            dense, vectors, lambda ef: setattr(settings, "KNOWLEDGE_PG_HNSW_EF_SEARCH", ef)
        )
    finally:
        settings.KNOWLEDGE_PG_HNSW_EF_SEARCH = configured


def _sweep(dense, vectors, set_ef) -> dict:
    """``{ef: {p50_ms, p95_ms, ids}}`` of the dense leg alone at each ``EF_SEARCH_SWEEP`` value
    (``set_ef(ef)`` applies it)."""
    out = {}
    for ef in EF_SEARCH_SWEEP:
        set_ef(ef)
        times, ids = [], []
        for vector in vectors:
            t0 = time.perf_counter()
            hits = dense(vector)
            times.append((time.perf_counter() - t0) * 1000)
            ids.append([_hex(h.node_id) for h in hits])
        out[str(ef)] = {"p50_ms": pct(times, 50), "p95_ms": pct(times, 95), "ids": ids}
    return out


def _configured_ef(engine: str) -> int:
    from django.conf import settings

    if engine == "postgres":
        return settings.KNOWLEDGE_PG_HNSW_EF_SEARCH
    return settings.KNOWLEDGE_DENSE_GRAPH_EF_SEARCH


def wait_for_graph(backend, space_id, number) -> dict:
    """Wait for the SQLite matrix's HNSW graph build started by the cold search (none below
    ``KNOWLEDGE_DENSE_GRAPH_MIN_ROWS``): its rows and the seconds waited."""
    t0 = time.perf_counter()
    while backend.dense_stats(space_id, number).get("graph_building"):
        time.sleep(1)
    stats = backend.dense_stats(space_id, number)
    waited = round(time.perf_counter() - t0, 1)
    if stats.get("graph_rows"):
        log(f"  dense graph of {stats['graph_rows']} rows ready after {waited} s more")
    return {"graph_rows": stats.get("graph_rows", 0), "waited_s": waited}


def graph_ef_sweep(backend, space_id, number, dense, vectors) -> dict:
    """The dense leg alone at other graph ``efSearch`` values (the matrix's own setting)."""
    matrix = backend._dense_matrices[(space_id, number)]
    configured = matrix.graph_ef_search
    try:
        return _sweep(dense, vectors, lambda ef: setattr(matrix, "graph_ef_search", ef))
    finally:
        matrix.graph_ef_search = configured


def explain_dense(queries: list[dict]) -> str | None:
    """``EXPLAIN`` of the dense leg's vector statement (the one ordering by a distance)."""
    from django.db import connection

    for query in queries:
        sql = query["sql"]
        if "<=>" in sql or "<#>" in sql or "<->" in sql:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(r[0] for r in cursor.fetchall())
                return re.sub(r"'\[[^\]]*\]'", "'[…]'", plan)  # the query vector's literal
    return None


def _hex(node_id) -> str:
    """A node id as 32 hex digits, whether the leg gives a UUID or its text."""
    return node_id.hex if hasattr(node_id, "hex") else str(node_id).replace("-", "")


def pct(values: list[float], p: float) -> float | None:
    from retrieval.evaluation import percentile

    return round(percentile(sorted(values), p), 2) if values else None


# --- report --------------------------------------------------------------------------------------
def recall(found: list[list[str]], truth: np.ndarray, k: int) -> float | None:
    if not found:
        return None
    hits = [len(set(f[:k]) & set(truth[q][:k])) / k for q, f in enumerate(found)]
    return round(float(np.mean(hits)), 4)
