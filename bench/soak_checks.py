"""What a soak pass reports (bench/soak.py): documents published, failed, stuck and lost, node
and projection counts against the expected ones, stale generations, the last stages and queue
waits, the recovery time of every job a killed cluster held, and ``kfs stats``."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import uuid
from collections import Counter

from soak_documents import ROOT, TENANT, TERMINAL


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
