"""Query latency per retrieval mode over HTTP, on spaces of N chunks (SciFact replicated).

1. Compiles (or reuses) the SciFact evaluation space of ``kfs eval`` (``--dataset``, default
   ``../shared/data/scifact``; a fresh database compiles 5,183 abstracts first, about 8 minutes).
2. Creates the space ``bench-latency`` (tenant ``kfs-bench``, dropped first if present) and, for
   each ``--sizes`` value in ascending order, grows it to that many visible chunks by copying the
   evaluation space's published nodes, vectors and keyword rows (``bench/replicate.py``: bulk
   inserts, no embedding; every copy is a published document of its own generation).
3. Starts ``gunicorn knowledgefs.wsgi`` on loopback (``--workers``, ``--threads``; the
   ``queries.create`` rate limit off) and, per size and mode, sends ``--warmup`` untimed then
   ``--queries`` timed ``POST /v1/knowledge-spaces/{id}/retrieval-tests`` requests, one at a
   time over one keep-alive connection, with an API key bound to the space. The SciFact test
   claims are the queries (cycled when more are asked for).

Writes ``bench/results/query-latency-DATE.json`` (or ``--out``) and prints a markdown table of
client-side p50/p95/mean (ms) and the server's own ``metrics.total_ms`` p50 per size and mode. A
mode that fails (not built yet, or a server error) is reported with its status and message.

Usage: ``python bench/query_latency.py [--sizes 10000,100000] [--modes fast,deep,research]
[--queries 200] [--dataset DIR]``. Smoke test: ``--dataset tests/fixtures/eval-mini --sizes 2000
--queries 5``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

TENANT = "kfs-bench"
SLUG = "bench-latency"


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (0.0 for none)."""
    from retrieval.evaluation import percentile as nearest_rank

    return nearest_rank(sorted(values), pct)


def free_port() -> int:
    """A loopback TCP port free at the time of the call."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``gunicorn knowledgefs.wsgi`` on a loopback port, in its own process group."""

    def __init__(self, workers: int, threads: int, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.args = [
            sys.executable, "-m", "gunicorn", "knowledgefs.wsgi",
            "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
            "--threads", str(threads), "--timeout", "300", "--no-control-socket",
        ]  # fmt: skip
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        from django.db import connections

        connections.close_all()
        env = {**os.environ, "KNOWLEDGE_RATE_LIMITS": json.dumps({"queries.create": None})}
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            self.args, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                conn.getresponse().read()
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("gunicorn did not answer within 120 s")

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def measure(port: int, space_id: str, key: str, mode: str, queries: list[str], warmup: int):
    """Send the queries one at a time; returns the mode's latency summary (or its error)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    path = f"/v1/knowledge-spaces/{space_id}/retrieval-tests"
    client, server = [], []
    for n, query in enumerate(queries[:warmup] + queries):
        body = json.dumps({"query": query, "mode": mode, "top_k": 10})
        t0 = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        elapsed = (time.perf_counter() - t0) * 1000
        if response.status != 200:
            try:
                detail = json.loads(payload)
            except ValueError:
                detail = {"message": payload[:200].decode("utf-8", "replace")}
            conn.close()
            return {"status": response.status, "error": detail.get("code") or detail.get("message")}
        if n >= warmup:
            client.append(elapsed)
            server.append(json.loads(payload).get("metrics", {}).get("total_ms", 0.0))
    conn.close()
    return {
        "status": 200,
        "queries": len(client),
        "p50_ms": round(percentile(client, 50), 2),
        "p95_ms": round(percentile(client, 95), 2),
        "mean_ms": round(statistics.fmean(client), 2),
        "server_p50_ms": round(percentile(server, 50), 2),
        "server_p95_ms": round(percentile(server, 95), 2),
    }


def table(result: dict) -> str:
    """The markdown table of ``result["sizes"]``: one row per size and mode."""
    lines = [
        "| chunks | mode | p50 ms | p95 ms | mean ms | server p50 ms | queries |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for size, modes in result["sizes"].items():
        for mode, row in modes.items():
            if row["status"] != 200:
                lines.append(f"| {size} | {mode} | error {row['status']}: {row['error']} | | | | |")
                continue
            lines.append(
                f"| {size} | {mode} | {row['p50_ms']} | {row['p95_ms']} | {row['mean_ms']} | "
                f"{row['server_p50_ms']} | {row['queries']} |"
            )
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark (see the module docstring); returns the exit status."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.replicate import replicate_space
    from knowledgefs.auth.principal import Principal
    from retrieval.evaluation import load_dataset, prepare_space
    from spaces.api_keys import create_api_key
    from spaces.models import KnowledgeSpace
    from spaces.services import create_space, delete_space

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--modes", default="fast,deep,research")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dataset = Path(args.dataset)
    if not dataset.exists():
        print(f"dataset not found: {dataset}", file=sys.stderr)
        return 2
    sizes = sorted(int(s) for s in args.sizes.split(","))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    call_command("migrate", verbosity=0)

    corpus_path, corpus, queries, qrels = load_dataset(dataset, "test")
    texts = [queries[q] for q in qrels if q in queries]
    texts = (texts * (args.queries // max(len(texts), 1) + 1))[: args.queries]
    source, _, _ = prepare_space(corpus_path, corpus)
    principal = Principal(tenant_id=TENANT)
    old = KnowledgeSpace.objects.filter(tenant_id=TENANT, slug=SLUG).first()
    if old is not None:
        delete_space(principal, old.id)
    target = create_space(principal, name="Latency benchmark", slug=SLUG)
    key = create_api_key(TENANT, spaces=[target], name="latency benchmark")[1]

    result = {
        "date": dt.date.today().isoformat(),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "database": connection.vendor,
        "source_space": source.slug,
        "source_chunks": source.nodes.count(),
        "server": {"workers": args.workers, "threads": args.threads},
        "queries": len(texts),
        "warmup": args.warmup,
        "top_k": 10,
        "replication": {},
        "sizes": {},
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"query-latency-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".gunicorn.log")
    for size in sizes:
        added = replicate_space(source, target, size)
        result["replication"][size] = added
        print(f"{size} chunks: {json.dumps(added)}", flush=True)
        with Server(args.workers, args.threads, log) as server:
            result["sizes"][size] = {}
            for mode in modes:
                row = measure(server.port, str(target.id), key, mode, texts, args.warmup)
                result["sizes"][size][mode] = row
                print(f"  {mode}: {json.dumps(row)}", flush=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
