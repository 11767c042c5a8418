"""One delivery of a replay run: start it (the kernel's compare-and-set), check the frozen
snapshot still stands, then replay each *pending* item in ordinal order, writing each result
under the delivery's fence, and finish ``passed`` or ``failed``.

Finished items are never run again by a later delivery (the sweep's requeue after a killed
worker continues with the pending ones). The frozen snapshot is the index version (number,
model, dimension) the run was created on: when the space no longer serves it (deleted, or
replaced by a cutover) the run fails ``frozen_snapshot_unavailable``. Each item runs the frozen
profile's ``top_k`` in the run's mode with the score threshold off, restricted to the frozen
publication (:mod:`.frozen`: documents published after the snapshot are left out, and a deleted
or replaced frozen generation fails the run ``frozen_snapshot_unavailable``); the publication
revision each item saw is kept (``metrics.publication_revision``) and
``summary.publication_drift`` counts the items that saw a revision other than the frozen one
(the head also moves for availability changes, which are not frozen).
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.utils import timezone

from knowledgefs.errors import ServiceError
from retrieval.golden import matches
from retrieval.modes import retrieve
from retrieval.recall import resolve_snapshot

from .frozen import FrozenPublication, SnapshotGone
from .models import ReplayItem, ReplayRun
from .replay_dispatch import QUEUE, ClaimLost

logger = logging.getLogger("knowledgefs.quality")


def check_snapshot(run: ReplayRun) -> int:
    """The publication head's revision now; :class:`SnapshotGone` when the space no longer
    serves the frozen index version (checked before each item: a cutover mid-run stops it)."""
    frozen = (run.frozen_snapshot or {}).get("index_version") or {}
    snapshot = resolve_snapshot(run.space)
    current = snapshot.version
    wanted = (frozen.get("number"), frozen.get("model_id"), frozen.get("dimension"))
    if current is None or tuple(current) != wanted:
        raise SnapshotGone(
            f"the frozen index version {wanted[0]} ({wanted[1]}, {wanted[2]}-d) is no longer "
            "served by this space"
            + (f" (it serves version {current[0]} now)" if current else " (it has none)")
            + "; retry the run to replay on a fresh snapshot"
        )
    return snapshot.head_revision


def evaluate(item: ReplayItem, result) -> tuple[bool, dict]:
    """``(passed, evidence_diff)`` of one item against the retrieval's items."""
    expected = item.expected_evidence or []
    found = [any(matches(e, r) for r in result.items) for e in expected]
    matched = sum(found)
    passed = matched == len(expected) if item.match_policy == "all" else matched > 0
    return passed, {
        "expected_count": len(expected),
        "retrieved_count": len(result.items),
        "matched_count": matched,
        "missing_count": len(expected) - matched,
        "evidence_items": [
            {
                "ordinal": n,
                "matched": hit,
                "document_id": e.get("document_id"),
                "node_id": e.get("node_id"),
                "text": (e.get("text") or "")[:200] or None,
            }
            for n, (e, hit) in enumerate(zip(expected, found, strict=True), 1)
        ],  # fmt: skip
        "retrieved": [
            {
                "node_id": str(r.node_id),
                "document_id": r.citation.get("document_id"),
                "filename": r.citation.get("filename"),
            }
            for r in result.items
        ],  # fmt: skip
    }


def replay_item(
    run: ReplayRun, item: ReplayItem, publication: FrozenPublication
) -> tuple[str, dict, dict]:
    frozen = run.frozen_snapshot["retrieval_profile"]
    t0 = time.perf_counter()
    allowed = publication.allowed(check_snapshot(run))
    result = retrieve(
        run.space, item.question, top_k=frozen["top_k"], mode=run.mode, score_threshold=None,
        filters=allowed,
    )  # fmt: skip
    passed, diff = evaluate(item, result)
    metrics = {
        "candidates": {
            s["name"]: s.get("candidate_count", 0)
            for s in result.stages
            if s.get("status") == "executed"
        },
        "total_ms": round((time.perf_counter() - t0) * 1000, 2),
        "publication_revision": (result.metrics or {}).get("publication_revision"),
        "excluded_documents": publication.excluded if allowed is not None else None,
    }
    return ("passed" if passed else "failed"), {"passed": passed, "evidence_diff": diff}, metrics


def summary_of(run: ReplayRun) -> dict:
    items = list(run.items.values("state", "result", "metrics"))
    done = [i for i in items if i["state"] != "pending"]
    passed = sum(i["state"] == "passed" for i in items)
    hits = sum((i["result"].get("evidence_diff") or {}).get("matched_count", 0) > 0 for i in done)
    frozen = (run.frozen_snapshot or {}).get("publication_revision")
    return {
        "total": len(items),
        "completed": len(done),
        "passed": passed,
        "failed": len(done) - passed,
        "pass_rate": round(passed / len(items), 4) if items else 0.0,
        "hit_rate": round(hits / len(done), 4) if done else 0.0,
        "publication_drift": sum(
            (i["metrics"] or {}).get("publication_revision") not in (None, frozen) for i in done
        ),
        "excluded_documents": max(
            ((i["metrics"] or {}).get("excluded_documents") or 0 for i in done), default=0
        ),
    }


def run_delivery(pk: str, task_id: str) -> str:
    """Run the replay if ``task_id`` still claims it; returns what happened."""
    run = QUEUE.begin(pk, task_id)
    if run is None:
        return "skipped"
    try:
        publication = FrozenPublication(run)
        for item in run.items.filter(state="pending").order_by("ordinal"):
            state, result, metrics = replay_item(run, item, publication)
            now = timezone.now()
            with transaction.atomic():
                if not QUEUE.held(run.id, task_id).update(step_started_at=now, updated_at=now):
                    raise ClaimLost(str(run.id))
                ReplayItem.objects.filter(id=item.id, state="pending").update(
                    state=state, result=result, metrics=metrics, completed_at=now
                )
    except ClaimLost:
        return "claim_lost"
    except SnapshotGone as exc:
        QUEUE.fail(run.id, task_id, "frozen_snapshot_unavailable", str(exc))
        ReplayRun.objects.filter(id=run.id).update(summary=summary_of(run))
        return "failed"
    except ServiceError as exc:
        QUEUE.fail(run.id, task_id, exc.code, exc.message)
        ReplayRun.objects.filter(id=run.id).update(summary=summary_of(run))
        return "failed"
    summary = summary_of(run)
    now = timezone.now()
    finished = QUEUE.held(run.id, task_id).update(
        state="passed" if summary["failed"] == 0 else "failed", summary=summary,
        task_id=None, claimed_at=None, step_started_at=None, completed_at=now, updated_at=now,
    )  # fmt: skip
    logger.info("replay run %s finished: %s", run.id, summary)
    return "finished" if finished else "claim_lost"
