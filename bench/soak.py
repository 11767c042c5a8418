"""Soak: compile real documents on a real worker cluster that is SIGKILLed every few seconds.

On the embedded default (SQLite in ``KNOWLEDGE_VAR_DIR``, local object files, the local ONNX
embedding model) this admits the first ``--docs`` SciFact abstracts (``title`` and ``text`` as
one ``.txt`` each) plus every file of ``../shared/data`` the service accepts, through
``admit_document`` with ``enqueue=True`` (the real claim-before-enqueue dispatch). Then it starts
``manage.py qcluster`` as a child process group and, every 3–8 seconds (seeded), SIGKILLs the
whole group and restarts it at once, while this driver runs ``recover_jobs()`` every 5 seconds
in place of the every-minute schedule. Killing stops once every job is terminal or after
``--cap-minutes``; the cluster then runs on without kills until every job is terminal (or
``--settle-minutes`` pass).

A clean pass (the same documents in a fresh space, the same cluster settings, no kills) runs
first, so the soak's wall time has a baseline.

Checked and reported: documents admitted / published / failed (by error code) / stuck (a
non-terminal job at the end) / lost (an admitted document missing, or without a terminal latest
job); node counts per document against a clean parse+chunk of the same bytes done here; nodes
and parse artifacts of non-active generations; keyword and dense projection counts against the
node count; the kills; and, for every job a killed cluster held, the time from the kill until
the job was claimed again and until it next reached a checkpoint or ended.

Usage (own state directory; the soak takes 10–20 minutes)::

    KNOWLEDGE_VAR_DIR=/work/bench-var-soak python bench/soak.py [--docs 240] [--seed 7]
        [--cap-minutes 20] [--skip-clean] [--out bench/results/FILE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

TERMINAL = {"succeeded", "failed", "canceled", "superseded"}
TENANT = "kfs-soak"
POLL_SECONDS = 0.25
SWEEP_SECONDS = 5.0


# --- documents ------------------------------------------------------------------------------


def corpus(docs: int) -> tuple[list[tuple[str, bytes]], dict]:
    """``(filename, bytes)`` of the documents to admit, and where they came from."""
    items: list[tuple[str, bytes]] = []
    source: dict = {}
    scifact = SHARED_DATA / "scifact" / "corpus.jsonl.gz"
    if scifact.exists():
        with gzip.open(scifact, "rt", encoding="utf-8") as handle:
            for line in handle:
                if len(items) >= docs:
                    break
                record = json.loads(line)
                text = f"{record.get('title', '').strip()}\n\n{record.get('text', '').strip()}"
                items.append((f"scifact-{record['_id']}.txt", text.encode("utf-8")))
        source["scifact_abstracts"] = len(items)
        real = sorted(p for p in SHARED_DATA.rglob("*") if p.is_file() and p.name != scifact.name)
        for path in real:
            items.append((str(path.relative_to(SHARED_DATA)), path.read_bytes()))
        source["real_files"] = [str(p.relative_to(SHARED_DATA)) for p in real]
        source["fallback"] = False
    else:  # no ../shared: the project's own docs, made distinct by a header
        pages = sorted((ROOT / "docs").glob("*.md"))
        n = 0
        while len(items) < docs:
            for page in pages:
                header = f"# Copy {n} of {page.name}\n\n".encode()
                items.append((f"copy-{n}-{page.name}", header + page.read_bytes()))
                if len(items) >= docs:
                    break
            n += 1
        source["fallback"] = "../shared/data absent: docs/*.md duplicated with distinct headers"
    return items, source


def expected_nodes(data: bytes, mime_type: str) -> int:
    """Chunks a clean run makes of these bytes (0 when the parser finds nothing)."""
    from django.conf import settings

    from ingestion import parsing
    from ingestion.chunking import chunk_elements

    try:
        report = parsing.parse_with_report(data, mime_type)
        return len(
            chunk_elements(
                report.elements,
                target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
                overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
            )
        )
    except parsing.ParseError:
        return 0


def admit(space, items) -> tuple[list[dict], list[dict]]:
    from ingestion.documents import admit_document
    from knowledgefs.errors import ServiceError

    admitted, rejected = [], []
    for filename, data in items:
        try:
            admission = admit_document(space, filename=filename, data=data, enqueue=True)
        except ServiceError as exc:
            rejected.append({"filename": filename, "bytes": len(data), "code": exc.code})
            continue
        document = admission.document
        admitted.append(
            {
                "document_id": document.id,
                "job_id": admission.job.id,
                "filename": filename,
                "mime_type": document.mime_type,
                "bytes": len(data),
                "expected_nodes": expected_nodes(data, document.mime_type),
            }
        )
    return admitted, rejected


# --- the cluster ----------------------------------------------------------------------------


class Cluster:
    """``manage.py qcluster`` in its own process group; SIGKILL takes every process of it."""

    def __init__(self, env: dict, log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def note(self, text: str) -> None:
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(f"=== soak driver {dt.datetime.now().isoformat()} {text}\n")

    def start(self) -> None:
        from django.db import connections

        connections.close_all()
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        self.starts += 1
        self.note(f"started cluster #{self.starts} pgid {self.process.pid}")

    def pids(self) -> set[int]:
        """Live processes of the cluster's process group."""
        if not self.process:
            return set()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            if int(fields[2]) == self.process.pid:  # field 5: process group
                found.add(int(entry.name))
        return found

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        # Reap nothing else: the group's other members were children of the sentinel and are
        # re-parented to init, which reaps them.

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        for pid in self.pids():  # stragglers of the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- one pass -------------------------------------------------------------------------------


def snapshot(space_id) -> dict:
    from ingestion.models import CompilationJob

    return {
        row[0]: {
            "document_id": row[1],
            "stage": row[2],
            "run_state": row[3],
            "attempts": row[4],
            "token": row[5],
            "worker": row[6],
            "error_code": row[7],
        }
        for row in CompilationJob.objects.filter(space_id=space_id).values_list(
            "id",
            "document_id",
            "stage",
            "run_state",
            "execution_attempts",
            "lease_token",
            "worker_id",
            "error_code",
        )
    }


def run_pass(
    name: str,
    items,
    *,
    env: dict,
    var_dir: Path,
    kill: bool,
    seed: int,
    cap_minutes: float,
    settle_minutes: float,
    stamp: str,
) -> dict:
    from ingestion.compilation.recovery import recover_jobs
    from spaces import services as spaces

    principal = spaces.Principal(tenant_id=TENANT)
    space = spaces.create_space(principal, name=f"soak {name} {stamp}", slug=f"{name}-{stamp}")
    started = time.monotonic()
    admitted, rejected = admit(space, items)
    admission_seconds = time.monotonic() - started
    print(
        f"[{name}] admitted {len(admitted)}, rejected {len(rejected)} in {admission_seconds:.1f} s",
        flush=True,
    )

    log = var_dir / f"soak-qcluster-{name}-{stamp}.log"
    cluster = Cluster(env, log)
    rng = random.Random(seed)
    kills: list[dict] = []
    sweeps: list[dict] = []
    # Per job: observed transitions (time since start, what changed).
    history: dict = {}
    last: dict = {}
    t0 = time.monotonic()
    cluster.start()
    next_kill = t0 + rng.uniform(3, 8) if kill else None
    next_sweep = t0 + SWEEP_SECONDS
    next_report = t0 + 10
    killing_until = t0 + cap_minutes * 60
    settle_until = killing_until + settle_minutes * 60
    all_terminal_at = None
    killing_stopped_at = None
    try:
        while True:
            now = time.monotonic()
            rows = snapshot(space.id)
            for job_id, row in rows.items():
                before = last.get(job_id)
                if before is None or (
                    before["stage"],
                    before["run_state"],
                    before["token"],
                ) != (row["stage"], row["run_state"], row["token"]):
                    history.setdefault(job_id, []).append(
                        {
                            "t": round(now - t0, 3),
                            "stage": row["stage"],
                            "run_state": row["run_state"],
                            "attempts": row["attempts"],
                            "token": str(row["token"]) if row["token"] else None,
                            "worker": row["worker"],
                        }
                    )
                last[job_id] = row
            live = [j for j, r in rows.items() if r["run_state"] not in TERMINAL]
            if not live:
                all_terminal_at = now
                break
            if next_kill is not None and now >= killing_until:
                next_kill = None
                killing_stopped_at = now
                cluster.note("kill cap reached; no more kills")
                print(f"[{name}] kill cap reached with {len(live)} live jobs", flush=True)
            if next_kill is None and now >= settle_until:
                break
            if next_kill is not None and now >= next_kill:
                pids = cluster.pids()
                interval = now - (kills[-1]["t"] + t0 if kills else t0)
                cluster.kill()
                killed_at = time.monotonic()
                after = snapshot(space.id)
                held = {
                    str(j): r["stage"]
                    for j, r in after.items()
                    if r["run_state"] == "running"
                    and r["worker"]
                    and int(r["worker"].rsplit(":", 1)[1]) in pids
                }
                stale = sum(
                    1
                    for j, r in after.items()
                    if r["run_state"] == "running" and str(j) not in held
                )
                kills.append(
                    {
                        "n": len(kills) + 1,
                        "t": round(killed_at - t0, 3),
                        "since_previous": round(interval, 3),
                        "cluster_pids": sorted(pids),
                        "held_jobs": held,
                        "running_from_earlier_kills": stale,
                        "states": dict(Counter(r["run_state"] for r in after.values())),
                    }
                )
                cluster.note(f"KILL #{len(kills)} pids {sorted(pids)} held {len(held)} jobs")
                cluster.start()
                next_kill = time.monotonic() + rng.uniform(3, 8)
            if now >= next_sweep:
                s = time.monotonic()
                report = recover_jobs().as_dict()
                if any(report.values()):
                    sweeps.append({"t": round(s - t0, 3), **report})
                next_sweep = s + SWEEP_SECONDS
            if now >= next_report:
                states = Counter(r["run_state"] for r in rows.values())
                stages = Counter(r["stage"] for r in rows.values() if r["run_state"] == "running")
                print(
                    f"[{name}] t={now - t0:6.1f}s kills={len(kills)} {dict(states)} "
                    f"running stages {dict(stages)}",
                    flush=True,
                )
                next_report = now + 10
            time.sleep(POLL_SECONDS)
    finally:
        ended = time.monotonic()
        cluster.stop()
        cluster.note("stopped")
    wall = (all_terminal_at or ended) - t0
    result = {
        "space": {"slug": space.slug, "id": str(space.id), "tenant": TENANT},
        "admission_seconds": round(admission_seconds, 2),
        "wall_seconds_cluster_start_to_all_terminal": round(wall, 2) if all_terminal_at else None,
        "ended_without_all_terminal_after_seconds": None if all_terminal_at else round(wall, 2),
        "killing_stopped_by_cap_at_seconds": round(killing_stopped_at - t0, 2)
        if killing_stopped_at
        else None,
        "cluster_starts": cluster.starts,
        "kills": len(kills),
        "kill_intervals_seconds": summary([k["since_previous"] for k in kills]),
        "recovery_sweeps_with_work": sweeps,
        "qcluster_log": str(log),
        "rejected_at_admission": rejected,
    }
    result.update(check(space, admitted))
    result["failed_jobs_last_stage_before_failure"] = last_stages(history, "failed")
    result["held_at_kills_per_job"] = dict(
        sorted(Counter(Counter(j for k in kills for j in k["held_jobs"]).values()).items())
    )
    result["recovery"] = recovery(kills, history)
    result["longest_wait_in_queued_per_job_seconds"] = queued_waits(history, ended - t0)
    result["kill_log"] = kills
    result["stats_command"] = kfs_stats(space.slug, env)
    print(f"[{name}] {json.dumps({k: v for k, v in result.items() if k != 'kill_log'})[:3000]}")
    return result


def check(space, admitted: list[dict]) -> dict:
    """Published, failed, stuck, lost, duplicated: the database against a clean parse+chunk."""
    from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact
    from retrieval.backends import get_search_backend

    published, failed, stuck, lost, duplicated = [], Counter(), [], [], []
    node_mismatch = []
    for item in admitted:
        document = Document.objects.filter(id=item["document_id"]).first()
        if document is None:
            lost.append({"filename": item["filename"], "why": "document row missing"})
            continue
        jobs = list(CompilationJob.objects.filter(document=document).order_by("created_at"))
        if not jobs:
            lost.append({"filename": item["filename"], "why": "no job"})
            continue
        latest = jobs[-1]
        if latest.run_state not in TERMINAL:
            stuck.append(
                {
                    "filename": item["filename"],
                    "job_id": str(latest.id),
                    "run_state": latest.run_state,
                    "stage": latest.stage,
                    "attempts": latest.execution_attempts,
                    "lease_expires_at": str(latest.lease_expires_at),
                    "task_id": latest.task_id,
                    "worker": latest.worker_id,
                }
            )
            continue
        nodes = KnowledgeNode.objects.filter(document=document)
        generations = set(nodes.values_list("generation", flat=True))
        if document.state == "published":
            published.append(item["filename"])
            count = nodes.count()
            if generations - {document.active_generation}:
                duplicated.append(
                    {"filename": item["filename"], "stray_generations": len(generations) - 1}
                )
            if not (count == item["expected_nodes"] == document.node_count):
                node_mismatch.append(
                    {
                        "filename": item["filename"],
                        "nodes": count,
                        "expected": item["expected_nodes"],
                        "document_node_count": document.node_count,
                    }
                )
        else:
            failed[latest.error_code or document.state] += 1
            if generations:
                duplicated.append({"filename": item["filename"], "nodes_of_failed": nodes.count()})
    documents = Document.objects.filter(space=space)
    nodes = KnowledgeNode.objects.filter(space=space)
    inactive = sum(
        KnowledgeNode.objects.filter(document=d).exclude(generation=d.active_generation).count()
        for d in documents
    )
    artifacts_inactive = sum(
        ParseArtifact.objects.filter(document=d).exclude(job_id=d.active_generation).count()
        for d in documents.filter(active_generation__isnull=False)
    )
    total = nodes.count()
    projections = get_search_backend().projection_counts(space.id)
    jobs = CompilationJob.objects.filter(space=space)
    return {
        "documents_admitted": len(admitted),
        "documents_published": len(published),
        "documents_failed": sum(failed.values()),
        "failed_by_code": dict(failed),
        "failed_documents": [
            {
                "filename": d.filename,
                "error_code": d.error_code,
                "message": d.error_message[:300],
            }
            for d in documents.exclude(state="published")
        ],
        "stuck": len(stuck),
        "stuck_jobs": stuck,
        "lost": len(lost),
        "lost_documents": lost,
        "duplicated": len(duplicated) + len(node_mismatch),
        "duplicated_detail": duplicated,
        "node_count_mismatches": node_mismatch,
        "nodes_total": total,
        "nodes_expected_for_published": sum(
            i["expected_nodes"]
            for i in admitted
            if Document.objects.filter(id=i["document_id"], state="published").exists()
        ),
        "nodes_of_non_active_generations": inactive,
        "parse_artifacts_of_non_active_generations_for_published": artifacts_inactive,
        "projections": projections,
        "projections_equal_nodes": projections == {"keyword": total, "dense": total},
        "jobs": jobs.count(),
        "jobs_by_state": dict(Counter(jobs.values_list("run_state", flat=True))),
        "execution_attempts_histogram": dict(
            sorted(Counter(jobs.values_list("execution_attempts", flat=True)).items())
        ),
    }


def last_stages(history: dict, run_state: str) -> dict:
    """For jobs that ended in ``run_state``: the last stage observed before they ended."""
    stages = Counter()
    for events in history.values():
        if events[-1]["run_state"] != run_state:
            continue
        before = [e["stage"] for e in events if e["run_state"] not in TERMINAL]
        stages[before[-1] if before else "never observed live"] += 1
    return dict(stages)


def queued_waits(history: dict, end: float) -> dict:
    """Per job, the longest observed stretch in ``queued`` (a lost message shows up here)."""
    longest = {}
    for job_id, events in history.items():
        best, since = 0.0, None
        for e in events:
            if e["run_state"] == "queued" and since is None:
                since = e["t"]
            elif e["run_state"] != "queued" and since is not None:
                best, since = max(best, e["t"] - since), None
        if since is not None:
            best = max(best, end - since)
        longest[str(job_id)] = round(best, 2)
    worst = sorted(longest.items(), key=lambda kv: -kv[1])[:5]
    return {**summary(list(longest.values())), "worst": dict(worst)}


def recovery(kills: list[dict], history: dict) -> dict:
    """Per (kill, held job): seconds until the job was claimed again, and until it progressed.

    Progress = the next observed checkpoint (stage change) or terminal state after the kill.
    Times are observed by polling every 0.25 s.
    """
    reclaim, progress, pairs = [], [], []
    for k in kills:
        for job_id, stage_at_kill in k["held_jobs"].items():
            events = [e for e in history.get(uuid.UUID(job_id), []) if e["t"] > k["t"]]
            token_at_kill = None
            for e in history.get(uuid.UUID(job_id), []):
                if e["t"] <= k["t"]:
                    token_at_kill = e["token"]
            claimed = next(
                (
                    e
                    for e in events
                    if e["run_state"] in TERMINAL
                    or (e["run_state"] == "running" and e["token"] != token_at_kill)
                ),
                None,
            )
            moved = next(
                (e for e in events if e["stage"] != stage_at_kill or e["run_state"] in TERMINAL),
                None,
            )
            until = moved["t"] if moved else 1e12
            later_kills = sum(1 for other in kills if k["t"] < other["t"] < until)
            held_again = sum(
                1 for other in kills if k["t"] < other["t"] < until and job_id in other["held_jobs"]
            )
            pair = {
                "kill": k["n"],
                "job": job_id,
                "stage_at_kill": stage_at_kill,
                "reclaimed_after": round(claimed["t"] - k["t"], 2) if claimed else None,
                "progressed_after": round(moved["t"] - k["t"], 2) if moved else None,
                "progressed_to": f"{moved['stage']}/{moved['run_state']}" if moved else None,
                "kills_before_progress": later_kills,
                "held_by_a_killed_cluster_again_before_progress": held_again,
            }
            pairs.append(pair)
            if claimed:
                reclaim.append(pair["reclaimed_after"])
            if moved:
                progress.append(pair["progressed_after"])
    slowest = max(
        (p for p in pairs if p["progressed_after"] is not None),
        key=lambda p: p["progressed_after"],
        default=None,
    )
    return {
        "pairs": len(pairs),
        "never_progressed": sum(1 for p in pairs if p["progressed_after"] is None),
        "until_next_checkpoint_or_end_seconds": summary(progress),
        "until_claimed_again_seconds": summary(reclaim),
        "pairs_held_by_a_killed_cluster_again_before_progress": sum(
            1 for p in pairs if p["held_by_a_killed_cluster_again_before_progress"]
        ),
        "slowest": slowest,
        "detail": pairs,
    }


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "n": len(values),
        "median": round(statistics.median(ordered), 2),
        "p95": round(p95, 2),
        "max": round(ordered[-1], 2),
        "min": round(ordered[0], 2),
    }


def kfs_stats(slug: str, env: dict) -> dict | str:
    out = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "kfs",
            "stats",
            "--space",
            slug,
            "--tenant",
            TENANT,
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return (out.stdout + out.stderr)[-2000:]


def compact(result: dict, detail: Path) -> dict:
    """The result without per-job lists (those stay in ``detail``, beside the cluster logs)."""
    result = json.loads(json.dumps(result, default=str))
    result["per_job_detail"] = str(detail)
    for name in ("clean", "soak"):
        run = result.get(name)
        if not run:
            continue
        run["recovery"].pop("detail", None)
        run["kill_log"] = [
            {
                **{k: v for k, v in kill.items() if k not in ("held_jobs", "cluster_pids")},
                "held_jobs": len(kill["held_jobs"]),
                "held_by_stage": dict(Counter(kill["held_jobs"].values())),
            }
            for kill in run["kill_log"]
        ]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=240, help="SciFact abstracts to admit")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lease", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cap-minutes", type=float, default=20)
    parser.add_argument("--settle-minutes", type=float, default=5)
    parser.add_argument(
        "--batch-documents", type=int, default=None, help="KNOWLEDGE_COMPILE_BATCH_DOCUMENTS"
    )
    parser.add_argument("--max-attempts", type=int, default=None, help="KNOWLEDGE_JOB_MAX_ATTEMPTS")
    parser.add_argument("--skip-clean", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    if "KNOWLEDGE_VAR_DIR" not in os.environ:
        print("set KNOWLEDGE_VAR_DIR to a state directory of your own", file=sys.stderr)
        return 2
    os.environ["KNOWLEDGE_JOB_LEASE_SECONDS"] = str(args.lease)
    os.environ["KNOWLEDGE_WORKERS"] = str(args.workers)
    if args.batch_documents:
        os.environ["KNOWLEDGE_COMPILE_BATCH_DOCUMENTS"] = str(args.batch_documents)
    if args.max_attempts:
        os.environ["KNOWLEDGE_JOB_MAX_ATTEMPTS"] = str(args.max_attempts)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    var_dir = Path(settings.VAR_DIR)
    env = {**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO")}
    items, source = corpus(args.docs)
    stamp = dt.datetime.now().strftime("%Y%m%d%H%M%S")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip() or os.environ.get("KFS_SOURCE_COMMIT", "")  # a `git archive` snapshot
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    result: dict = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "git_head": head,
        "working_tree_modified_files": [line[3:] for line in dirty if line.strip()],
        "config": {
            "database": str(settings.DATABASES["default"]["NAME"]),
            "lease_seconds": settings.KNOWLEDGE_JOB_LEASE_SECONDS,
            "workers": settings.Q_CLUSTER["workers"],
            "embedding_threads_per_worker": max(1, (os.cpu_count() or 1) // args.workers),
            "compile_batch_documents": settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS,
            "max_attempts": settings.KNOWLEDGE_JOB_MAX_ATTEMPTS,
            "kill_interval_seconds": [3, 8],
            "seed": args.seed,
            "driver_sweep_every_seconds": SWEEP_SECONDS,
            "poll_seconds": POLL_SECONDS,
            "cap_minutes": args.cap_minutes,
            "settle_minutes": args.settle_minutes,
        },
        "source": source,
        "documents_offered": len(items),
    }
    if not args.skip_clean:
        result["clean"] = run_pass(
            "clean",
            items,
            env=env,
            var_dir=var_dir,
            kill=False,
            seed=args.seed,
            cap_minutes=args.cap_minutes,
            settle_minutes=args.settle_minutes,
            stamp=stamp,
        )
    result["soak"] = run_pass(
        "soak",
        items,
        env=env,
        var_dir=var_dir,
        kill=True,
        seed=args.seed,
        cap_minutes=args.cap_minutes,
        settle_minutes=args.settle_minutes,
        stamp=stamp,
    )
    clean_wall = result.get("clean", {}).get("wall_seconds_cluster_start_to_all_terminal")
    soak_wall = result["soak"]["wall_seconds_cluster_start_to_all_terminal"]
    if clean_wall and soak_wall:
        result["soak_to_clean_wall_ratio"] = round(soak_wall / clean_wall, 2)
    soak = result["soak"]
    result["never_stuck"] = (
        soak["stuck"] == 0
        and soak["lost"] == 0
        and soak["duplicated"] == 0
        and soak["nodes_of_non_active_generations"] == 0
        and soak["projections_equal_nodes"]
    )
    detail = var_dir / f"soak-detail-{stamp}.json"
    detail.write_text(json.dumps(result, default=str) + "\n")
    out = Path(args.out or ROOT / "bench" / "results" / f"soak-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(compact(result, detail), indent=2, default=str) + "\n")
    print(f"wrote {out} (per job detail: {detail}); never_stuck={result['never_stuck']}")
    return 0 if result["never_stuck"] else 1


if __name__ == "__main__":
    sys.exit(main())
