"""What one Fast query costs KnowledgeFS under the Dify bridge backend, at N visible chunks.

``KNOWLEDGE_SEARCH_BACKEND=dify`` against the simulated Dify of
``knowledgefs/testing/dify_server.py`` on loopback, run in a child process of its own (so its CPU
time is not on the measured interpreter's GIL) and stopped with this script. Steps:

1. Fresh SQLite database in ``--var`` (default ``/work/bridgebench-var``), migrated; a space
   ``bridge-scale`` (tenant ``kfs-bench``) with its active index version (local model,
   384 dimensions).
2. For each ``--sizes`` value in ascending order the space grows to that many visible chunks:
   synthetic published documents (``--chunks-per-doc`` chunks each; text: 12..40 words from a
   fixed word list; vectors: random unit 384-d, seeded) written in one transaction per batch of
   documents, the rows in bulk and the projections through the backend's real write path
   (``index_dense`` → vector upserts + ledger rows, ``index_keywords`` → text upserts, 64 points
   per request). Indexing throughput is the chunks per second of those two backend calls.
3. ``--warmup`` untimed then ``--queries`` timed ``retrieval.modes.retrieve(space, q,
   top_k=10, mode="fast")`` calls (queries: 3..6 words of the word list, seeded). Per query:
   the wall time; ``wait``, the wall time with at least one request to Dify in flight
   (:class:`WaitClock`); ``kfs_side`` = wall - wait; ``cpu``, this process's CPU time (the
   simulated Dify runs in another); and from the server, per route, the requests, the request
   bytes (Content-Length) and its handler time (read, parse, search, answer; summed over
   requests, which overlap up to ``KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY`` at a time).

``--server stock`` runs ``knowledgefs/testing/dify_server.py`` as it is (cosine in pure Python over
the asked ids; BM25 by building an FTS5 table over the whole collection for every request).
``--server indexed`` (default) keeps the contract and the answers but holds each collection's
vectors in a numpy matrix and its texts in one FTS5 table, rebuilt only after upserts, as a real
engine would, so the dense leg's server share stays small (BM25 still ranks every matching row
of the collection before the authorized-id filter, which dominates at 100k chunks).

Bounded: no size is started and no query timed after ``--budget`` seconds (default 1500); what
was measured is written. The simulated Dify exits on its own 60 s after the budget, or as soon
as this script ends. Writes ``bench/results/bridge-scale-DATE.json`` (or ``--out``) and prints
a markdown table. ``--profile`` adds a cProfile of 3 queries at the largest size.

Usage: ``python bench/bridge_scale.py [--sizes 10000,100000] [--queries 30] [--server indexed]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TENANT = "kfs-bench"
SLUG = "bridge-scale"
DIMENSION = 384
STATS = "/bench/stats"
WORDS = (
    "protein cell gene expression tumor immune response patient clinical trial dose receptor "
    "signal pathway mutation cancer therapy virus infection antibody vaccine brain neuron "
    "memory sleep heart blood pressure insulin glucose liver kidney lung bone muscle fat diet "
    "exercise risk factor cohort study mouse model sample analysis method result effect "
    "increase decrease level rate growth death survival treatment drug target binding enzyme "
    "membrane channel calcium sodium potassium oxygen stress aging inflammation cytokine "
    "macrophage lymphocyte stem differentiation development embryo placenta pregnancy infant "
    "child adult elderly population prevalence incidence mortality hospital care policy cost "
    "quality outcome measure scale score index marker biomarker genome sequence variant "
    "allele population transmission network structure function domain complex assembly"
).split()


# --- the simulated Dify, in its own process -----------------------------------------------------


def serve(mode: str, lifetime: float) -> None:
    """Run the simulated Dify (``mode`` stock or indexed); print its URL; stop when stdin
    closes or after ``lifetime`` seconds. ``GET /bench/stats`` answers (and resets) the
    per-route counters: requests, request bytes, handler seconds."""
    from knowledgefs.testing import dify_server as ds

    stats: dict[str, list[float]] = {}
    lock = threading.Lock()
    original = ds._Handler._dispatch

    def dispatch(self) -> None:  # noqa: ANN001
        route = self.path.split("?")[0]
        if route == STATS:
            with lock:
                body = json.dumps(stats).encode()
                stats.clear()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        started = time.perf_counter()
        size = int(self.headers.get("Content-Length") or 0)
        try:
            original(self)
        finally:
            spent = time.perf_counter() - started
            operation = ""
            record = getattr(self, "_record", None)
            if record is not None and isinstance(record.body, dict):
                operation = str(record.body.get("operation", ""))
            with lock:
                row = stats.setdefault(f"{route} {operation}", [0, 0, 0.0])
                row[0] += 1
                row[1] += size
                row[2] += spent
            with self.dify.lock:  # keep memory flat: the recorded requests are not needed
                self.dify.requests.clear()

    ds._Handler._dispatch = dispatch
    if mode == "indexed":
        _index_bridge(ds)
    server = ds.DifyTestServer(dimension=DIMENSION).start()
    print(server.url, flush=True)
    timer = threading.Timer(lifetime, lambda: os._exit(0))
    timer.daemon = True
    timer.start()
    sys.stdin.read()  # the parent closed the pipe (or died)
    os._exit(0)


def _index_bridge(ds) -> None:  # noqa: ANN001
    """Replace the bridge's searches with cached indexes (same contract, same scores)."""
    import sqlite3

    import numpy as np

    cache: dict[int, tuple] = {}

    def vector_search(collection: dict, request: dict, ids: list[str]) -> list[dict]:
        key = id(collection)
        entry = cache.get(key)
        if entry is None or entry[0] != len(collection):
            names = list(collection)
            matrix = np.array([collection[n]["vector"] for n in names], dtype=np.float32)
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            entry = (len(collection), {n: i for i, n in enumerate(names)}, names, matrix)
            cache[key] = entry
        _, position, names, matrix = entry
        rows = np.array([position[i] for i in ids if i in position], dtype=np.int64)
        if not len(rows):
            return []
        query = np.asarray(request["query_vector"], dtype=np.float32)
        scores = matrix[rows] @ (query / np.linalg.norm(query))
        top = np.argsort(-scores)[: request["limit"]]
        return [{"id": names[rows[t]], "score": float(scores[t])} for t in top]

    def text_search(collection: dict, request: dict, ids: list[str]) -> list[dict]:
        words = list(dict.fromkeys(ds._WORD.findall(request["query"].lower())))
        if not words:
            return []
        key = -id(collection)
        entry = cache.get(key)
        if entry is None or entry[0] != len(collection):
            db = sqlite3.connect(":memory:", check_same_thread=False)
            db.execute(
                "CREATE VIRTUAL TABLE t USING fts5(text, id UNINDEXED, "
                "tokenize = 'porter unicode61 remove_diacritics 2')"
            )
            db.executemany(
                "INSERT INTO t (text, id) VALUES (?, ?)",
                [(p["text"], pid) for pid, p in collection.items()],
            )
            db.execute("CREATE TEMP TABLE allowed (id TEXT PRIMARY KEY)")
            entry = (len(collection), db)
            cache[key] = entry
        db = entry[1]
        match = "text : (" + " OR ".join('"' + w.replace('"', '""') + '"' for w in words) + ")"
        db.execute("DELETE FROM allowed")
        db.executemany("INSERT OR IGNORE INTO allowed VALUES (?)", [(i,) for i in ids])
        rows = db.execute(
            "SELECT id, rank FROM t WHERE t MATCH ? AND id IN (SELECT id FROM allowed) "
            "ORDER BY rank LIMIT ?",
            (match, request["limit"]),
        ).fetchall()
        return [{"id": pid, "score": -float(rank)} for pid, rank in rows]

    ds.BridgeStore._vector_search = staticmethod(vector_search)
    ds.BridgeStore._text_search = staticmethod(text_search)


class Simulator:
    """The child process running :func:`serve`."""

    def __init__(self, mode: str, lifetime: float, log: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode, "--budget", str(int(lifetime))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("ab"),
            cwd=ROOT,
            text=True,
        )
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"simulated Dify did not start (see {log})")

    def stats(self) -> dict[str, list[float]]:
        """Per ``"<route> <operation>"``: ``[requests, request bytes, handler seconds]`` since
        the last call."""
        import urllib.request

        with urllib.request.urlopen(self.url + STATS, timeout=30) as answer:  # loopback only
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --- the measuring side -------------------------------------------------------------------------


class WaitClock:
    """Wall time during which at least one HTTP request of this process to Dify is in flight
    (``requests.Session.request``: the body sent, the server's work, the answer's headers; the
    bridge's answers are a few hundred bytes). Installed by wrapping the method in this
    process only."""

    def __init__(self) -> None:
        import requests

        self.lock = threading.Lock()
        self.in_flight = 0
        self.since = 0.0
        self.total = 0.0
        original = requests.Session.request
        clock = self

        def request(session, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            clock._enter()
            try:
                return original(session, *args, **kwargs)
            finally:
                clock._leave()

        requests.Session.request = request

    def _enter(self) -> None:
        with self.lock:
            if self.in_flight == 0:
                self.since = time.perf_counter()
            self.in_flight += 1

    def _leave(self) -> None:
        with self.lock:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.total += time.perf_counter() - self.since

    def take(self) -> float:
        """Seconds waited since the last call."""
        with self.lock:
            total, self.total = self.total, 0.0
        return total


def load() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (0.0 for none)."""
    from retrieval.evaluation import percentile as nearest_rank

    return nearest_rank(sorted(values), pct)


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def grow(space, version, backend, have: int, want: int, per_doc: int, rng, sim) -> dict:  # noqa: ANN001
    """Add published synthetic documents until the space holds ``want`` visible chunks.
    Returns the chunks added, the seconds in the backend's writes and in total, and the
    server's counters for the writes."""
    import hashlib

    import numpy as np
    from django.db import transaction
    from django.utils import timezone

    from ingestion.compilation.generations import _NODE_NAMESPACE
    from ingestion.models import (
        CompilationJob,
        Document,
        DocumentState,
        KnowledgeNode,
        RunState,
        Stage,
    )
    from retrieval.backends.base import IndexedNode
    from spaces.models import PublicationHead

    started = time.perf_counter()
    backend_seconds = 0.0
    added = 0
    sim.stats()
    batch_docs = max(1, 2000 // per_doc)
    while have + added < want:
        now = timezone.now()
        docs, jobs, nodes, indexed = [], [], [], []
        for _ in range(batch_docs):
            count = min(per_doc, want - have - added - len(nodes))
            if count <= 0:
                break
            generation, doc_id = uuid.uuid4(), uuid.uuid4()
            texts = [sentence(rng, 12, 40) for _ in range(count)]
            doc = Document(
                id=doc_id,
                tenant_id=space.tenant_id,
                space=space,
                filename=f"synthetic-{doc_id.hex[:12]}.txt",
                mime_type="text/plain",
                size_bytes=sum(len(t) + 1 for t in texts),
                sha256=hashlib.sha256(doc_id.bytes).hexdigest(),
                storage_key=f"bench/{doc_id}",
                state=DocumentState.PUBLISHED,
                active_generation=generation,
                node_count=count,
                metadata={},
            )
            docs.append(doc)
            jobs.append(
                CompilationJob(
                    id=generation, tenant_id=space.tenant_id, space=space, document=doc,
                    stage=Stage.PUBLISHED, run_state=RunState.SUCCEEDED,
                    progress_percent=100, started_at=now, finished_at=now,
                )
            )  # fmt: skip
            offset = 0
            for index, text in enumerate(texts):
                node = KnowledgeNode(
                    id=uuid.uuid5(_NODE_NAMESPACE, f"{generation}:{index}"),
                    space=space, document=doc, generation=generation, chunk_index=index,
                    kind="text", text=text, start_offset=offset,
                    end_offset=offset + len(text), section_path=[],
                )  # fmt: skip
                offset += len(text) + 1
                nodes.append(node)
                indexed.append(IndexedNode(node.id, space.id, doc.id, text))
        vectors = np.asarray(
            np.random.default_rng(rng.randrange(1 << 30)).standard_normal((len(nodes), DIMENSION)),
            dtype=np.float32,
        )
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with transaction.atomic():
            Document.objects.bulk_create(docs, batch_size=500)
            CompilationJob.objects.bulk_create(jobs, batch_size=500)
            KnowledgeNode.objects.bulk_create(nodes, batch_size=500)
            t0 = time.perf_counter()
            backend.index_dense(
                indexed, vectors, index_version=version.number, model_id=version.model_id
            )
            backend.index_keywords(indexed)
            backend_seconds += time.perf_counter() - t0
        added += len(nodes)
    PublicationHead.objects.advance(space.id)
    return {
        "chunks": added,
        "backend_seconds": round(backend_seconds, 2),
        "total_seconds": round(time.perf_counter() - started, 2),
        "chunks_per_second": round(added / backend_seconds, 1) if backend_seconds else None,
        "server": sim.stats(),
        "load": load(),
    }


def measure(space, queries: list[str], warmup: int, sim, clock, deadline: float) -> dict:  # noqa: ANN001
    """Run the queries (``warmup`` first, untimed); per query the wall time, this process's CPU
    time, the time waited on Dify (:class:`WaitClock`) and the server's counters. Stops early
    past ``deadline``."""
    from retrieval.modes import retrieve

    for q in queries[:warmup]:
        retrieve(space, q, top_k=10, mode="fast")
    sim.stats()
    rows = []
    for q in queries[warmup:]:
        if time.monotonic() > deadline:
            break
        clock.take()
        t0, c0 = time.perf_counter(), time.process_time()
        result = retrieve(space, q, top_k=10, mode="fast")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append(
            {
                "wall": wall,
                "cpu": cpu,
                "wait": clock.take(),
                "items": len(result.items),
                "server": sim.stats(),
            }
        )
    return summarize(rows)


def summarize(rows: list[dict]) -> dict:
    """p50/p95 of wall, server and KnowledgeFS-side ms; requests and bytes per leg per query."""
    if not rows:
        return {"queries": 0}

    def leg(row: dict, route: str, column: int) -> float:
        return sum(v[column] for k, v in row["server"].items() if k.startswith(route))

    walls = [r["wall"] * 1000 for r in rows]
    server = [leg(r, "/inner/api/knowledge-fs/", 2) * 1000 for r in rows]
    waits = [r["wait"] * 1000 for r in rows]
    kfs = [w - s for w, s in zip(walls, waits, strict=True)]
    cpu = [r["cpu"] * 1000 for r in rows]
    out = {"queries": len(rows), "items_min": min(r["items"] for r in rows)}
    for name, values in (("wall", walls), ("wait", waits), ("kfs_side", kfs), ("cpu", cpu),
                         ("server_handler_sum", server)):  # fmt: skip
        out[f"{name}_ms_p50"] = round(percentile(values, 50), 1)
        out[f"{name}_ms_p95"] = round(percentile(values, 95), 1)
    for name, route in (("dense", "/inner/api/knowledge-fs/vectors"),
                        ("keyword", "/inner/api/knowledge-fs/texts")):  # fmt: skip
        out[f"{name}_requests"] = max(leg(r, route, 0) for r in rows)
        out[f"{name}_request_bytes"] = int(max(leg(r, route, 1) for r in rows))
        out[f"{name}_server_ms_p50"] = round(
            percentile([leg(r, route, 2) * 1000 for r in rows], 50), 1
        )
    return out


def profile(space, queries: list[str]) -> list[str]:  # noqa: ANN001
    """cProfile of ``queries``: the top 30 functions by cumulative time."""
    import cProfile
    import io
    import pstats

    from retrieval.modes import retrieve

    profiler = cProfile.Profile()
    profiler.enable()
    for q in queries:
        retrieve(space, q, top_k=10, mode="fast")
    profiler.disable()
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(30)
    return buffer.getvalue().splitlines()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunks-per-doc", type=int, default=50)
    parser.add_argument("--server", choices=("indexed", "stock"), default="indexed")
    parser.add_argument("--var", default="/work/bridgebench-var")
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds for the whole run")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--serve", choices=("indexed", "stock"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.budget + 60)
        return 0
    deadline = time.monotonic() + args.budget
    var = Path(args.var)
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    sim = Simulator(args.server, args.budget, var / "dify-server.log")
    try:
        return run(args, var, sim, deadline)
    finally:
        sim.stop()


def run(args, var: Path, sim: Simulator, deadline: float) -> int:  # noqa: ANN001
    from knowledgefs.testing.dify_server import TEST_INNER_KEY

    os.environ.update(
        DJANGO_SETTINGS_MODULE="knowledgefs.settings",
        KNOWLEDGE_VAR_DIR=str(var),
        KNOWLEDGE_SEARCH_BACKEND="dify",
        DIFY_INNER_API_URL=sim.url,
        DIFY_INNER_API_KEY=TEST_INNER_KEY,
    )
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from retrieval.backends import get_search_backend
    from retrieval.index_versions import ensure_active_version
    from spaces.services import Principal, create_space

    call_command("migrate", verbosity=0)
    space = create_space(Principal(tenant_id=TENANT), name="Bridge scale", slug=SLUG)
    version = ensure_active_version(space)
    backend = get_search_backend()
    clock = WaitClock()
    rng = random.Random(20261130)
    queries = [sentence(rng, 3, 6) for _ in range(args.warmup + args.queries)]
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "database": "sqlite",
        "backend": type(backend).__name__,
        "server": args.server,
        "model": [version.model_id, version.dimension],
        "bridge_concurrency": settings.KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY,
        "top_k": 10,
        "mode": "fast",
        "sizes": {},
    }
    have = 0
    for size in sorted(int(s) for s in args.sizes.split(",")):
        if time.monotonic() > deadline:
            result["sizes"][str(size)] = {"skipped": "time budget spent"}
            continue
        written = grow(space, version, backend, have, size, args.chunks_per_doc, rng, sim)
        have += written["chunks"]
        print(f"{size}: indexed {written['chunks']} at {written['chunks_per_second']}/s "
              f"(load {written['load']})", flush=True)  # fmt: skip
        entry = {"indexing": written, "load_before": load()}
        entry["query"] = measure(space, queries, args.warmup, sim, clock, deadline)
        entry["load_after"] = load()
        result["sizes"][str(size)] = entry
        print(json.dumps(entry["query"]), flush=True)
    if args.profile and time.monotonic() < deadline:
        result["profile"] = profile(space, queries[:3])
    out = Path(args.out or ROOT / "bench" / "results" / f"bridge-scale-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"written: {out}")
    return 0


def table(result: dict) -> str:
    """The markdown table of a run."""
    lines = [
        "| chunks | dense req | dense bytes | keyword req | keyword bytes | wall p50 / p95 ms "
        "| waiting on Dify p50 ms | KnowledgeFS side p50 / p95 ms | KnowledgeFS CPU p50 ms "
        "| server handler sum p50 ms | index chunks/s | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size, entry in result["sizes"].items():
        q = entry.get("query") or {}
        if not q.get("queries"):
            lines.append(f"| {size} | skipped | | | | | | | | | | |")
            continue
        lines.append(
            f"| {int(size):,} | {q['dense_requests']} | {q['dense_request_bytes']:,} "
            f"| {q['keyword_requests']} | {q['keyword_request_bytes']:,} "
            f"| {q['wall_ms_p50']} / {q['wall_ms_p95']} | {q['wait_ms_p50']} "
            f"| {q['kfs_side_ms_p50']} / {q['kfs_side_ms_p95']} | {q['cpu_ms_p50']} "
            f"| {q['server_handler_sum_ms_p50']} "
            f"| {entry['indexing']['chunks_per_second']} | {entry['load_before']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
