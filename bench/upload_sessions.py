"""Upload sessions against gunicorn on loopback: 50 concurrent 15 MiB small-file sessions.

1. A fresh state directory (``--var``, default a temporary one): migrate, one space, one API key.
2. ``gunicorn knowledgefs.wsgi`` on loopback, one worker with ``--threads`` threads (enough for
   every client to wait in the small-fallback gate), the product's settings (gate: 2 bodies,
   30 MiB reserved; idle 30 s).
3. Baseline: the worker's ``VmRSS`` after one small session went through (Django, the routes
   and the storage loaded).
4. ``--sessions`` clients at once, each: create a session for a unique ``--size`` text file,
   send its bytes to ``…/small-file`` in 64 KiB pieces (generated on the fly: the client holds
   no file), and record the answer. The worker's ``VmHWM`` (peak RSS) is read from
   ``/proc/<pid>/status`` after the run, and the gate's admission order from ``/health``.
5. A stalled client: sends half of its body, stops; it must get 408 and the gate's reservation
   must be zero again.
6. A busy run: the server restarted with a 1 s idle timeout, ``--busy`` clients at once: the
   ones that waited longer get 429 ``upload_admission_busy``.
7. Storage against the database: every stored object must be a document's source (no object of
   an aborted, expired, failed or refused session).

Writes ``bench/results/upload-sessions-DATE.json`` (or ``--out``) and prints a summary.

Usage: ``python bench/upload_sessions.py [--sessions 50] [--size 15728640] [--threads 64]``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
PIECE = 64 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """``gunicorn knowledgefs.wsgi`` (one worker) on a loopback port, in its own process group."""

    def __init__(self, env: dict, threads: int, log: Path) -> None:
        self.port = free_port()
        self.env = env
        self.log = log
        self.args = [
            sys.executable, "-m", "gunicorn", "knowledgefs.wsgi",
            "--bind", f"127.0.0.1:{self.port}", "--workers", "1",
            "--threads", str(threads), "--timeout", "600", "--no-control-socket",
        ]  # fmt: skip
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.log.read_text()[-2000:]}")
            try:
                self.health()
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

    def health(self) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/health")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def worker_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids = [int(p) for p in children.read_text().split()]
        if len(pids) != 1:
            raise RuntimeError(f"expected one gunicorn worker, found {pids}")
        return pids[0]

    def reset_peak(self) -> None:
        """Reset the worker's ``VmHWM`` to its current RSS (``clear_refs`` 5, Linux)."""
        Path(f"/proc/{self.worker_pid()}/clear_refs").write_text("5")

    def memory(self) -> dict:
        fields = {}
        for line in Path(f"/proc/{self.worker_pid()}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
        return fields


def content(label: str, size: int):
    """The bytes of one client's file, in pieces (unique text, generated on the fly)."""
    line = f"{label} upload session benchmark line of readable text.\n".encode()
    block = line * (PIECE // len(line) + 1)
    sent = 0
    while sent < size:
        piece = block[: min(PIECE, size - sent)]
        sent += len(piece)
        yield piece


def checksum(label: str, size: int) -> str:
    digest = hashlib.sha256()
    for piece in content(label, size):
        digest.update(piece)
    return base64.b64encode(digest.digest()).decode()


def call(port: int, key: str, method: str, path: str, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(
            method,
            path,
            json.dumps(body).encode() if body is not None else b"",
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        raw = answer.read()
        return answer.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def session(port, key, space_id, label, size, *, stop_after: int | None = None) -> dict:
    """One client: create, send (all, or ``stop_after`` bytes then wait), read the answer."""
    status, created = call(
        port,
        key,
        "POST",
        f"/v1/knowledge-spaces/{space_id}/upload-sessions",
        {
            "file_name": f"{label}.txt",
            "content_type": "text/plain",
            "expected_size_bytes": size,
            "checksum_sha256": checksum(label, size),
        },
    )
    if status != 201:
        return {"label": label, "status": status, "code": created.get("code"), "phase": "create"}
    sid = created["session"]["id"]
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    try:
        sock.sendall(
            (
                f"POST /v1/knowledge-spaces/{space_id}/upload-sessions/{sid}/small-file "
                f"HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
            ).encode()
        )
        sent = 0
        try:
            for piece in content(label, size):
                if stop_after is not None and sent >= stop_after:
                    break
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered (429) before reading the body
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the server answered and closed before the whole body was sent
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        raw = answer.read()
        body = json.loads(raw) if raw else {}
        return {
            "label": label,
            "session_id": sid,
            "status": answer.status,
            "code": body.get("code"),
            "state": body.get("session", {}).get("status"),
            "seconds": round(time.monotonic() - started, 3),
            "finished_at": time.monotonic(),
        }
    finally:
        sock.close()


def run_clients(port, key, space_id, labels, size) -> list[dict]:
    results: list[dict] = []
    lock = threading.Lock()

    def one(label: str) -> None:
        try:
            outcome = session(port, key, space_id, label, size)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            outcome = {"label": label, "status": None, "error": repr(exc)}
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one, args=(label,)) for label in labels]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # arrival order = label order
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--size", type=int, default=15 * MIB)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--busy", type=int, default=12)
    parser.add_argument("--var", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    var = Path(args.var or tempfile.mkdtemp(prefix="kfs-upload-bench-"))
    env = {
        **os.environ,
        "KNOWLEDGE_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "knowledgefs.settings",
        "KNOWLEDGE_RATE_LIMITS": json.dumps({"default": None, "documents.create": None}),
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    from ingestion.models import Document, UploadSession
    from spaces.api_keys import create_api_key
    from spaces.services import Principal, create_space

    space = create_space(Principal(tenant_id="bench"), name="Upload bench")
    key = create_api_key("bench")[1]
    connections.close_all()
    log = var / "gunicorn.log"
    report: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "sessions": args.sessions,
        "size_bytes": args.size,
        "threads": args.threads,
        "cpus": os.cpu_count(),
    }
    with Server(env, args.threads, log) as server:
        # /health starts the components' checks in the background (the model runtime loads
        # its model): let them finish, then one small session, before the baseline.
        server.health()
        time.sleep(10)
        server.health()
        warm = session(server.port, key, space.id, "warmup", 4096)
        assert warm["status"] == 200, warm
        time.sleep(2)
        server.reset_peak()
        baseline = server.memory()["VmRSS"]
        t0 = time.monotonic()
        labels = [f"client-{n:03d}" for n in range(args.sessions)]
        results = run_clients(server.port, key, space.id, labels, args.size)
        elapsed = time.monotonic() - t0
        memory = server.memory()
        health = server.health()["small_fallback_uploads"]
        ok = [r for r in results if r["status"] == 200 and r.get("state") == "completed"]
        order = [r["label"] for r in sorted(ok, key=lambda r: r["finished_at"])]
        inversions = sum(
            1 for a, b in zip(order, order[1:], strict=False) if labels.index(a) > labels.index(b)
        )
        refused = sorted(labels.index(r["label"]) for r in results if r["status"] == 429)
        done = sorted(labels.index(r["label"]) for r in ok)
        report["load"] = {
            "completed": len(ok),
            # FIFO: the refused are the latest arrivals (indices in arrival order)
            "refused_arrival_indices": refused,
            "last_completed_arrival_index": done[-1] if done else None,
            "statuses": sorted({str(r["status"]) + ":" + str(r.get("code")) for r in results}),
            "seconds": round(elapsed, 1),
            "mib_per_second": round(len(ok) * args.size / MIB / elapsed, 1),
            "slowest_client_seconds": max((r.get("seconds", 0) for r in results), default=0),
            "finish_order_inversions": inversions,
            "baseline_rss_mib": round(baseline / MIB, 1),
            "peak_rss_mib": round(memory["VmHWM"] / MIB, 1),
            "peak_over_baseline_mib": round((memory["VmHWM"] - baseline) / MIB, 1),
            "reserved_limit_mib": round(health["max_reserved_bytes"] / MIB, 1),
            "gate": health,
        }
        stalled = session(
            server.port, key, space.id, "stalled", 2 * MIB, stop_after=MIB
        )  # the body stops half way: 408 after the idle timeout
        after = server.health()["small_fallback_uploads"]
        report["stalled"] = {
            "status": stalled["status"],
            "code": stalled["code"],
            "seconds": stalled.get("seconds"),
            "reserved_after": after["reserved_bytes"],
            "active_after": after["active"],
            "timeout_idle": after["counters"].get("timeout_idle", 0),
        }
    busy_env = {**env, "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS": "1000"}
    with Server(busy_env, args.threads, log) as server:
        labels = [f"busy-{n:03d}" for n in range(args.busy)]
        results = run_clients(server.port, key, space.id, labels, args.size)
        health = server.health()["small_fallback_uploads"]
        report["busy"] = {
            "clients": args.busy,
            "completed": sum(1 for r in results if r["status"] == 200),
            "refused_429": sum(1 for r in results if r["status"] == 429),
            "other": sorted(
                {f"{r['status']}:{r.get('code')}" for r in results if r["status"] not in (200, 429)}
            ),
            "counters": health["counters"],
            "reserved_after": health["reserved_bytes"],
        }
    # every session still open expires (the sweep of the recovery schedule)
    from datetime import timedelta

    from django.utils import timezone

    from ingestion.upload_sessions import sweep_expired

    UploadSession.objects.filter(status="ready").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    report["sweep"] = sweep_expired(batch=1000)
    # storage against the database: only documents' sources may be stored
    objects = var / "objects"
    stored = {
        str(p.relative_to(objects))
        for p in objects.rglob("*")
        if p.is_file() and "_probe" not in p.parts
    }
    sources = set(Document.objects.values_list("storage_key", flat=True))
    report["storage"] = {
        "objects": len(stored),
        "documents": len(sources),
        "objects_without_document": sorted(stored - sources)[:10],
        "sessions_by_status": {
            s: UploadSession.objects.filter(status=s).count()
            for s in UploadSession.objects.values_list("status", flat=True).distinct()
        },
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"upload-sessions-{dt.date.today()}.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "load"}, indent=2))
    print(json.dumps({k: v for k, v in report["load"].items() if k != "gate"}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
