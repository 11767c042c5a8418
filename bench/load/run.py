"""Load test: concurrent uploads and queries against gunicorn on loopback, then a loss audit.

1. A fresh state directory (``--var-dir``, default ``var/load-<engine>``; its SQLite database, or
   the PostgreSQL of ``DATABASE_URL`` when set: run under ``scripts/with_postgres.py``):
   ``manage.py migrate``, then ``manage.py kfs space create`` (tenant ``kfs-load``, space
   ``load``) and ``--keys`` API keys bound to it (``manage.py kfs apikey create``).
2. Starts the stack with ``scripts/serve.sh`` itself (its own process group; one log,
   ``serve.log``): ``manage.py qcluster`` (``KNOWLEDGE_WORKERS`` workers) and ``gunicorn
   knowledgefs.wsgi`` (gthread, ``--workers``/``--threads``, keep-alive 75 s, ``--timeout 120``),
   bound to 127.0.0.1 on a free port (``KNOWLEDGE_BIND``) and never to any other address; waits
   for ``/ready`` = 200.
3. Runs ``locust --headless -u USERS -r RATE -t DURATION --csv …`` as a subprocess with
   ``bench/load/locustfile.py`` (uploads with ``Idempotency-Key``, Fast and Deep retrieval, Fast
   answers, document polls, lists). Locust (gevent) is never imported here. ``/proc/loadavg`` is
   sampled every 5 s meanwhile.
4. Drains: waits until no compilation job of the space is live (``--drain-timeout``, 900 s).
5. Audits every upload the clients saw accepted (202/201 with a document id), through the API
   (``GET …/documents/{id}``) and the database (document row, its latest job, its visible nodes
   and their dense vectors). A document is **lost** when it is missing from either, not terminal
   after the drain, published without visible nodes or vectors, or failed with a code that is
   not a documented terminal verdict on bad input (``BAD_INPUT_CODES``). Also reported: documents
   in the database that no client saw accepted (uploads in flight when Locust stopped), stuck
   jobs, and ``Traceback``/``ERROR``/``WORKER TIMEOUT`` lines of ``serve.log``.

Pass: no Locust failure (every response was expected or a documented 429/408 admission), no
lost document, no stuck job, no server error in the logs. Writes ``--out`` (JSON; default
``bench/results/load-<engine>-<date>.json``), prints a markdown table, exits 1 on failure.

Usage (``make loadtest ENGINE=sqlite|postgresql`` wraps it)::

    python bench/load/run.py [--users 12] [--spawn-rate 2] [--duration 300] [--keys 4]
    python scripts/with_postgres.py python bench/load/run.py --duration 300
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import http.client
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
TENANT = "kfs-load"
SLUG = "load"
# Terminal verdicts on a genuinely bad input (docs/api.md, "Documents and jobs"): a document
# that fails with one of these is accounted for, not lost. Anything else (internal_error,
# timeout, worker_lost, embedding_failed, …) is a server-side failure.
BAD_INPUT_CODES = {
    "no_extractable_text", "encrypted_pdf", "corrupt_pdf", "corrupt_document", "corrupt_image",
    "image_too_large", "undetectable_encoding", "drm_protected", "archive_rejected",
    "unsupported_media_type", "ocr_unavailable",
}  # fmt: skip
TEXT_SUFFIXES = {".md", ".txt", ".csv", ".html", ".htm", ".eml"}
LOG_ALARMS = (
    "Traceback", " ERROR ", "[ERROR]", "WORKER TIMEOUT", "database is locked",
    "Internal Server Error",
)  # fmt: skip


# --- the corpus and the queries -------------------------------------------------------------


def corpus(seed: int) -> tuple[list[dict], dict]:
    """Upload items (``name``, ``path`` or ``content``, ``text``) in a seeded order, and sources.

    Real documents only: ``docs/*.md``, every file of ``../shared/data/sample-docs``, and SciFact
    abstracts (``../shared/data/scifact``, else the 200 of ``tests/fixtures/eval-mini``), one
    ``.txt`` each (title, blank line, text). Sources that are absent are skipped.
    """
    items: list[dict] = [
        {"name": p.name, "path": str(p), "text": True} for p in sorted((ROOT / "docs").glob("*.md"))
    ]
    sources = {"docs_md": len(items)}
    samples = SHARED / "sample-docs"
    if samples.is_dir():
        files = sorted(p for p in samples.iterdir() if p.is_file())
        items += [
            {"name": p.name, "path": str(p), "text": p.suffix.lower() in TEXT_SUFFIXES}
            for p in files
        ]
        sources["sample_docs"] = len(files)
    scifact = SHARED / "scifact" / "corpus.jsonl.gz"
    if not scifact.exists():
        scifact = ROOT / "tests" / "fixtures" / "eval-mini" / "corpus.jsonl.gz"
    abstracts = 0
    with gzip.open(scifact, "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            text = f"{record.get('title', '').strip()}\n\n{record.get('text', '').strip()}\n"
            items.append({"name": f"scifact-{record['_id']}.txt", "content": text, "text": True})
            abstracts += 1
    sources["scifact_abstracts"] = abstracts
    sources["scifact_from"] = str(scifact.relative_to(ROOT.parent))
    rng = random.Random(seed)
    real = sources["docs_md"] + sources.get("sample_docs", 0)
    head, tail = items[:real], items[real:]
    rng.shuffle(tail)
    # The varied real files are spread over the first few hundred uploads, not bunched at the
    # start: one every 8 uploads.
    mixed: list[dict] = []
    rng.shuffle(head)
    while head or tail:
        if head:
            mixed.append(head.pop())
        mixed.extend(tail[:7])
        del tail[:7]
    return mixed, sources


def queries() -> list[str]:
    """Query texts: SciFact claims (shared, else the fixture's) and questions about the docs."""
    path = SHARED / "scifact" / "queries.jsonl"
    if not path.exists():
        path = ROOT / "tests" / "fixtures" / "eval-mini" / "queries.jsonl"
    texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    texts += [
        "How does an uploaded document become searchable?",
        "What happens when a file is larger than the upload limit?",
        "How is an upload admitted, and what does 429 upload_admission_busy mean?",
        "Which settings control the worker cluster and job leases?",
        "How do I retry a failed compilation job?",
        "What does the readiness probe check?",
    ]
    return texts


# --- the stack ------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port free at the time of the call."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env: dict, *args: str) -> str:
    """Run ``manage.py ARGS`` to completion; returns its stdout (raises on a non-zero exit)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def spawn(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """Start ``args`` in a new process group with stdout and stderr to ``log``."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def stop(process: subprocess.Popen | None, grace: float = 60) -> None:
    """SIGTERM the process group this run started; SIGKILL it after ``grace`` seconds."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def request(port: int, method: str, path: str, key: str | None = None, timeout: float = 30):
    """One HTTP request to the server on loopback; ``(status, parsed JSON or None)``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {key}"} if key else {})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, None


def wait_ready(port: int, server: subprocess.Popen, log: Path, limit: float = 180) -> dict:
    """Wait until ``/ready`` answers 200; returns its body (raises with the log's tail
    otherwise)."""
    deadline = time.monotonic() + limit
    body = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            status, body = request(port, "GET", "/ready", timeout=5)
            if status == 200:
                return body
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"/ready did not answer 200 within {limit:.0f} s: {body}")


class LoadSampler(threading.Thread):
    """Samples ``/proc/loadavg`` (1-minute figure) every ``every`` seconds until stopped."""

    def __init__(self, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples = every, []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def summary(self) -> dict:
        values = self.samples or [float(Path("/proc/loadavg").read_text().split()[0])]
        return {
            "min": min(values),
            "mean": round(sum(values) / len(values), 2),
            "max": max(values),
            "samples": len(values),
        }


# --- the run --------------------------------------------------------------------------------


def locust_stats(prefix: Path) -> dict:
    """Per-route figures of Locust's ``PREFIX_stats.csv`` (milliseconds, requests/s)."""
    routes = {}
    with open(f"{prefix}_stats.csv", newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            routes[row["Name"]] = {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": round(float(row["Requests/s"]), 2),
                "p50_ms": float(row["50%"] or 0),
                "p95_ms": float(row["95%"] or 0),
                "p99_ms": float(row["99%"] or 0),
                "max_ms": round(float(row["Max Response Time"] or 0), 1),
            }
    return routes


def drain(space_id: str, limit: float) -> dict:
    """Wait until no job of the space is live (at most ``limit`` s); the drain's figures."""
    from ingestion.models import LIVE_RUN_STATES, CompilationJob

    started = time.monotonic()
    live = CompilationJob.objects.filter(space_id=space_id, run_state__in=LIVE_RUN_STATES)
    initial = live.count()
    while time.monotonic() - started < limit:
        remaining = live.count()
        if remaining == 0:
            break
        time.sleep(2)
    return {
        "live_at_start": initial,
        "seconds": round(time.monotonic() - started, 1),
        "live_at_end": live.count(),
        "limit_seconds": limit,
    }


def audit(space_id: str, accepted: list[dict], read) -> dict:
    """Account for every accepted upload through the API and the database.

    ``accepted``: the clients' records (``document_id``, ``filename``); ``read(path)`` → ``(HTTP
    status, JSON body)`` of a ``GET`` on the API. A document is lost when the API or the
    database does not have it, they disagree on its state, it is not terminal, it is published
    without visible nodes (or with fewer dense vectors than nodes, or a node count other than
    the recorded one), or it failed with a code outside ``BAD_INPUT_CODES``. Returns the counts,
    the first 50 lost documents with their reason, documents no client saw accepted, and the
    space's jobs by run state (``stuck_jobs``: still live).
    """
    from django.db.models import Count

    from ingestion.models import LIVE_RUN_STATES, CompilationJob, Document, KnowledgeNode
    from retrieval.models import DenseVector

    lost, failed_codes, published = [], {}, 0
    for entry in accepted:
        doc_id = entry["document_id"]
        status, body = read(f"/v1/knowledge-spaces/{space_id}/documents/{doc_id}")
        row = Document.objects.filter(id=doc_id, space_id=space_id).first()
        job = CompilationJob.objects.filter(document_id=doc_id).order_by("-created_at").first()
        reason = None
        if status != 200 or row is None:
            reason = f"missing: API {status}, database {'row' if row else 'none'}"
        elif body.get("state") != row.state:
            reason = f"API state {body.get('state')} != database {row.state}"
        elif row.state == "published":
            nodes = KnowledgeNode.objects.filter(document=row, generation=row.active_generation)
            count = nodes.count()
            vectors = DenseVector.objects.filter(node__in=nodes).count()
            if count == 0 or count != row.node_count or vectors < count:
                reason = f"published: {count} nodes ({row.node_count} recorded), {vectors} vectors"
            else:
                published += 1
        elif row.state == "failed":
            failed_codes[row.error_code] = failed_codes.get(row.error_code, 0) + 1
            if row.error_code not in BAD_INPUT_CODES:
                reason = f"failed {row.error_code}: {row.error_message[:200]}"
        else:
            reason = f"not terminal: {row.state}, job {job and job.run_state}"
        if reason:
            lost.append({"document_id": doc_id, "filename": entry["filename"], "reason": reason})
    seen = {entry["document_id"] for entry in accepted}
    in_db = Document.objects.filter(space_id=space_id)
    unseen = [
        {"document_id": str(d.id), "filename": d.filename, "state": d.state}
        for d in in_db
        if str(d.id) not in seen
    ]
    jobs = CompilationJob.objects.filter(space_id=space_id)
    return {
        "accepted": len(accepted),
        "published": published,
        "failed_bad_input": {c: n for c, n in failed_codes.items() if c in BAD_INPUT_CODES},
        "failed_other": {c: n for c, n in failed_codes.items() if c not in BAD_INPUT_CODES},
        "lost": len(lost),
        "lost_documents": lost[:50],
        "documents_in_database": in_db.count(),
        "not_seen_accepted_by_a_client": unseen[:50],
        "stuck_jobs": jobs.filter(run_state__in=LIVE_RUN_STATES).count(),
        "jobs_by_run_state": dict(
            jobs.values_list("run_state").annotate(n=Count("id")).values_list("run_state", "n")
        ),
        "job_execution_attempts_over_1": jobs.filter(execution_attempts__gt=1).count(),
    }


def log_alarms(*logs: Path) -> dict:
    """Lines of the server logs that point to a server-side error (first 20 of each)."""
    found = {}
    for log in logs:
        lines = [
            line.strip()
            for line in log.read_text(errors="replace").splitlines()
            if any(alarm in line for alarm in LOG_ALARMS)
        ]
        found[log.name] = {"count": len(lines), "first": lines[:20]}
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--spawn-rate", type=float, default=2)
    parser.add_argument("--duration", type=int, default=300, help="seconds of load")
    parser.add_argument("--keys", type=int, default=4, help="API keys shared by the users")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn threads per worker")
    parser.add_argument(
        "--keep-alive", type=int, default=None, help="KNOWLEDGE_API_KEEPALIVE_SECONDS for serve.sh"
    )
    parser.add_argument("--cluster-workers", type=int, default=2, help="KNOWLEDGE_WORKERS")
    parser.add_argument("--drain-timeout", type=float, default=900)
    parser.add_argument("--weights", default="upload=3,fast=10,deep=2,answer=2,poll=3,list=2")
    parser.add_argument("--wait", default="0.5,2.0", help="think time between tasks, min,max s")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--var-dir", default=None)
    parser.add_argument("--out", default=None)
    return parser.parse_args()


def prepare(args, env: dict, work: Path) -> dict:
    """Migrate, create the space and keys, write Locust's configuration; returns it."""
    manage(env, "migrate", "--noinput", "-v", "0")
    space = json.loads(
        manage(
            env, "kfs", "space", "create", "Load test", "--tenant", TENANT, "--slug", SLUG, "--json"
        )  # fmt: skip
    )
    keys = [
        json.loads(
            manage(
                env,
                "kfs",
                "apikey",
                "create",
                "--tenant",
                TENANT,
                "--space",
                SLUG,
                "--name",
                f"load-{n}",
                "--json",
            )  # fmt: skip
        )["secret"]
        for n in range(args.keys)
    ]
    items, sources = corpus(args.seed)
    weights = dict(
        (name, int(value)) for name, value in (p.split("=") for p in args.weights.split(","))
    )
    wait_min, wait_max = (float(v) for v in args.wait.split(","))
    config = {
        "space_id": space["id"], "keys": keys, "corpus": items, "sources": sources,
        "queries": queries(), "weights": weights, "wait_min": wait_min, "wait_max": wait_max,
        "seed": args.seed, "replay_every": 5, "client_report": str(work / "clients.json"),
    }  # fmt: skip
    (work / "locust-config.json").write_text(json.dumps(config), encoding="utf-8")
    return config


def run_locust(args, env: dict, work: Path, port: int) -> int:
    """Locust headless as a subprocess (its own interpreter: gevent never enters this one)."""
    locust = Path(sys.executable).with_name("locust")
    command = [
        str(locust), "-f", str(ROOT / "bench" / "load" / "locustfile.py"), "--headless",
        "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.duration}s",
        "--host", f"http://127.0.0.1:{port}", "--csv", str(work / "locust"),
        "--stop-timeout", "60", "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    locust_env = {**env, "LOAD_CONFIG": str(work / "locust-config.json")}
    with (work / "locust.log").open("ab") as handle:
        return subprocess.call(
            command, cwd=ROOT, env=locust_env, stdout=handle, stderr=subprocess.STDOUT
        )


def table(summary: dict) -> str:
    """The per-route markdown table of ``summary``."""
    lines = [
        "| route | requests | RPS | p50 ms | p95 ms | p99 ms | failures |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary["routes"].items():
        lines.append(
            f"| {name} | {row['requests']} | {row['rps']} | {row['p50_ms']:.0f} | "
            f"{row['p95_ms']:.0f} | {row['p99_ms']:.0f} | {row['failures']} |"
        )
    return "\n".join(lines)


def verdict(summary: dict) -> list[str]:
    """Why the run failed (empty: it passed)."""
    problems = []
    if summary["locust_exit"] not in (0, 1):
        problems.append(f"locust exited {summary['locust_exit']}")
    if summary["other_errors"]:
        problems.append(f"{summary['other_errors']} responses other than 2xx or 429/408 admissions")
    if summary["documents"]["lost"]:
        problems.append(f"{summary['documents']['lost']} documents lost")
    if summary["documents"]["stuck_jobs"]:
        problems.append(f"{summary['documents']['stuck_jobs']} jobs still live after the drain")
    if summary["documents"]["accepted"] == 0:
        problems.append("no upload was accepted")
    for name, alarms in summary["log_alarms"].items():
        if alarms["count"]:
            problems.append(f"{alarms['count']} error lines in {name}")
    return problems


def main() -> int:  # noqa: PLR0915 - one linear script
    """Run the load test (module docstring); returns 0 when it passed, 1 otherwise."""
    args = parse_args()
    engine = "postgresql" if os.environ.get("DATABASE_URL", "").strip() else "sqlite"
    var = Path(args.var_dir or ROOT / "var" / f"load-{engine}").resolve()
    shutil.rmtree(var, ignore_errors=True)
    work = var / "run"
    work.mkdir(parents=True)
    runtime = var / "runtime"
    runtime.mkdir(mode=0o700)
    env = {
        **os.environ, "KNOWLEDGE_VAR_DIR": str(var), "XDG_RUNTIME_DIR": str(runtime),
        "KNOWLEDGE_WORKERS": str(args.cluster_workers),
        "DJANGO_SETTINGS_MODULE": "knowledgefs.settings",
    }  # fmt: skip
    os.environ.update(
        {k: env[k] for k in ("KNOWLEDGE_VAR_DIR", "XDG_RUNTIME_DIR", "DJANGO_SETTINGS_MODULE")}
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    config = prepare(args, env, work)
    port = free_port()
    log = work / "serve.log"
    sampler = LoadSampler()
    started = dt.datetime.now(dt.UTC)
    serve_env = {
        **env, "KNOWLEDGE_BIND": f"127.0.0.1:{port}", "KNOWLEDGE_API_WORKERS": str(args.workers),
        "KNOWLEDGE_API_THREADS": str(args.threads),
    }  # fmt: skip
    if args.keep_alive:
        serve_env["KNOWLEDGE_API_KEEPALIVE_SECONDS"] = str(args.keep_alive)
    server = None
    try:
        # scripts/serve.sh itself: the cluster, then gunicorn with the access log on stdout.
        server = spawn(["bash", str(ROOT / "scripts" / "serve.sh")], serve_env, log)
        ready = wait_ready(port, server, log)
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        sampler.start()
        t0 = time.monotonic()
        locust_exit = run_locust(args, env, work, port)
        load_seconds = round(time.monotonic() - t0, 1)
        sampler.halt.set()
        import django

        django.setup()
        from django.db import connection

        drained = drain(config["space_id"], args.drain_timeout)
        clients = json.loads(Path(config["client_report"]).read_text(encoding="utf-8"))
        key = config["keys"][0]
        documents = audit(
            config["space_id"], clients["accepted"], lambda path: request(port, "GET", path, key)
        )
        vendor = connection.vendor
    finally:
        sampler.halt.set()
        stop(server)
    routes = locust_stats(work / "locust")
    summary = {
        "date": started.isoformat(timespec="seconds"),
        "commit": commit,
        "engine": vendor,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "users": args.users, "spawn_rate": args.spawn_rate, "duration_s": args.duration,
        "load_wall_s": load_seconds, "keys": args.keys,
        "server": {"workers": args.workers, "threads": args.threads, "keep_alive": args.keep_alive,
                   "cluster_workers": args.cluster_workers},
        "weights": config["weights"], "wait_s": [config["wait_min"], config["wait_max"]],
        "corpus": config["sources"], "locust_exit": locust_exit,
        "routes": routes,
        "statuses": clients["statuses"], "admissions": clients["admissions"],
        # The clients' own count: Locust's CSV can miss the last responses of the stop timeout.
        "other_errors": max(len(clients["errors"]), routes["Aggregated"]["failures"]),
        "errors_first": clients["errors"][:20],
        "uploads_drawn": clients["uploads_started"],
        "load_average": {"before": load_before, **sampler.summary()},
        "drain": drained, "documents": documents,
        "log_alarms": log_alarms(log),
        # Which search backend served the queries (pgvector on PostgreSQL with the extension).
        "search_check": ready.get("checks", {}).get("search"),
        "work_dir": str(work),
    }  # fmt: skip
    problems = verdict(summary)
    summary["passed"], summary["problems"] = not problems, problems
    out = Path(args.out or ROOT / "bench" / "results" / f"load-{vendor}-{started.date()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(table(summary))
    shown = ("admissions", "other_errors", "load_average", "drain", "passed", "problems")
    print(json.dumps({k: summary[k] for k in shown}, indent=1))
    print("documents:", json.dumps({k: v for k, v in documents.items() if "documents" not in k}))
    print(f"written: {out}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
