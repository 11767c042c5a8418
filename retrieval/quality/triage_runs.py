"""Durable triage runs of failed queries (``POST …/failed-queries/triage`` → 202, ``GET
…/failed-queries/triage-runs/{id}`` to poll; docs/quality.md).

Creation checks the request (``limit``: at most this many rows, 1–1,000, default 1,000), keeps
the requester's provenance, writes the run and dispatches it through the jobs kernel after the
commit (:mod:`.triage_dispatch`). The same ``Idempotency-Key`` (8–255 characters, per requester)
with the same request answers the same run; with another request it is 409
``idempotency_key_reused``.

A delivery (:func:`run_delivery`) starts by the kernel's compare-and-set, then takes the
``pending-triage`` rows of the space that the run's provenance covers, oldest first, in batches
of :data:`BATCH`; each row is labelled by :func:`.triage.verdict_for` and moved by
:func:`.triage.move` (compare-and-set on its status and revision) in the same transaction as the
fenced write of the run's progress, so a run taken back (sweep) writes nothing more, and a row
labelled once is never labelled again (a second delivery, or a second run, skips it).

Listing (:func:`runs`, newest first, ``?state=``), cancel (``queued``/``running`` →
``canceled``) and retry (a finished run → ``queued``, ``attempt`` + 1, the summary counted
afresh over the rows still pending) are compare-and-set on ``revision`` (409
``revision_conflict``), as replay runs.
"""

from __future__ import annotations

import hashlib
import json
import logging

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, ServiceError

from . import triage_judge
from .models import FailedQuery, TriageRun
from .replay import check_idempotency_key, expected_revision, revision_conflict, same_request
from .scope import one, provenance_of, readable
from .triage import VERDICTS, bounded_limit, move, verdict_for
from .triage_dispatch import QUEUE, ClaimLost

logger = logging.getLogger("knowledgefs.quality")

BATCH = 50
MAX_ROWS = 1000
MEMBERS = ("limit",)


def _request(body) -> int:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(MEMBERS))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a triage member (members: {', '.join(MEMBERS)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    return bounded_limit(body.get("limit"), MAX_ROWS, MAX_ROWS)


def _fingerprint(space, limit: int) -> str:
    canonical = json.dumps({"space": str(space.id), "limit": limit}, sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _empty_summary() -> dict:
    return {"triaged": 0, "verdicts": dict.fromkeys(VERDICTS, 0)}


def create_run(principal, space, body, *, idempotency_key: str | None = None):
    """``(run, created)``; the run is dispatched after the commit."""
    key = check_idempotency_key(idempotency_key)
    limit = _request(body)
    fingerprint = _fingerprint(space, limit)
    provenance = provenance_of(principal)
    if key is not None:
        existing = TriageRun.objects.filter(
            tenant_id=principal.tenant_id, requester=provenance["requester"], idempotency_key=key
        ).first()
        if existing is not None:
            return same_request(existing, fingerprint), False
    try:
        with transaction.atomic():
            run = TriageRun.objects.create(
                **provenance, space=space, row_limit=limit, idempotency_key=key,
                request_fingerprint=fingerprint, summary=_empty_summary(),
            )  # fmt: skip
            QUEUE.dispatch_on_commit(run.id)
    except IntegrityError:  # the same key, created concurrently
        existing = TriageRun.objects.get(
            tenant_id=principal.tenant_id, requester=provenance["requester"], idempotency_key=key
        )
        return same_request(existing, fingerprint), False
    return run, True


def get_run(principal, space, ident) -> TriageRun:
    return one(principal, TriageRun, space, ident, "triage_run_not_found", "triage run")


def runs(principal, space, params):
    """The triage runs of ``space`` the caller may read, filtered by ``state``."""
    rows = readable(principal, TriageRun.objects.all(), space)
    state = params.get("state")
    if state is not None:
        if state not in TriageRun.STATES:
            raise InvalidInput(
                f"state must be one of: {', '.join(TriageRun.STATES)}",
                code="invalid_state",
                details={"field": "state"},
            )
        rows = rows.filter(state=state)
    return rows


def cancel_run(run: TriageRun, body) -> TriageRun:
    """``queued`` or ``running`` → ``canceled`` (409 ``triage_run_finished`` otherwise). A
    delivery under way stops at its next fenced write; the rows it labelled stay labelled."""
    expected = expected_revision(body)
    if run.state in TriageRun.TERMINAL:
        raise Conflict(f"the triage run already ended {run.state}", code="triage_run_finished")
    now = timezone.now()
    if not TriageRun.objects.filter(
        id=run.id, revision=expected, state__in=("queued", "running")
    ).update(
        state="canceled", revision=F("revision") + 1, task_id=None, claimed_at=None,
        step_started_at=None, completed_at=now, updated_at=now,
    ):  # fmt: skip
        raise revision_conflict(run, expected, "triage")
    run.refresh_from_db()
    return run


def retry_run(principal, run: TriageRun, body) -> TriageRun:
    """A finished run queued again over the rows still ``pending-triage``: ``attempt`` + 1, the
    summary counted afresh, the retrying caller's provenance (``principal`` None keeps the
    run's: the admin's action). 409 ``triage_run_active`` while it runs."""
    expected = expected_revision(body)
    if run.state not in TriageRun.TERMINAL:
        raise Conflict(f"the triage run is still {run.state}", code="triage_run_active")
    now = timezone.now()
    fields = provenance_of(principal) if principal is not None else {}
    with transaction.atomic():
        if not TriageRun.objects.filter(
            id=run.id, revision=expected, state__in=TriageRun.TERMINAL
        ).update(
            **fields, state="queued", revision=F("revision") + 1, attempt=F("attempt") + 1,
            summary=_empty_summary(), error_code="", error_message="", task_id=None,
            claimed_at=None, step_started_at=None, attempt_count=0, started_at=None,
            completed_at=None, updated_at=now,
        ):  # fmt: skip
            raise revision_conflict(run, expected, "triage")
        QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run


def _covered(run: TriageRun, row: FailedQuery) -> bool:
    """The run's requester covers ``row`` (:func:`.scope.covers` from the stored provenance)."""
    if run.permission_scope is None:
        return True
    return row.permission_scope is not None and set(row.permission_scope) <= set(
        run.permission_scope
    )


def pending(run: TriageRun, seen: set):
    """The next batch of ``pending-triage`` rows the run's requester may read, oldest first."""
    rows = FailedQuery.objects.filter(
        tenant_id=run.tenant_id, space_id=run.space_id, status="pending-triage"
    ).exclude(id__in=seen)
    scope = run.permission_scope
    if scope is not None:
        rows = rows.filter(scope_key=scope[0]) if len(scope) == 1 else rows.exclude(scope_key="")
    return list(rows.order_by("created_at", "id")[:BATCH])


def run_delivery(pk: str, task_id: str) -> str:
    """Run the triage if ``task_id`` still claims it; returns what happened."""
    run = QUEUE.begin(pk, task_id)
    if run is None:
        return "skipped"
    summary = run.summary or _empty_summary()
    seen: set = set()
    try:
        selection = triage_judge.selection_of(run.space)
        while summary["triaged"] < run.row_limit:
            batch = pending(run, seen)
            if not batch:
                break
            for row in batch:
                seen.add(row.id)
                if not _covered(run, row) or summary["triaged"] >= run.row_limit:
                    continue
                verdict, signals = verdict_for(run.space, row.query, selection)
                now = timezone.now()
                with transaction.atomic():
                    if not QUEUE.held(run.id, task_id).update(step_started_at=now, updated_at=now):
                        raise ClaimLost(str(run.id))
                    if move(row, verdict, signals):
                        summary["triaged"] += 1
                        summary["verdicts"][verdict] += 1
                        QUEUE.held(run.id, task_id).update(summary=summary)
    except ClaimLost:
        return "claim_lost"
    except ServiceError as exc:
        QUEUE.fail(run.id, task_id, exc.code, exc.message)
        return "failed"
    now = timezone.now()
    finished = QUEUE.held(run.id, task_id).update(
        state="succeeded", summary=summary, task_id=None, claimed_at=None,
        step_started_at=None, completed_at=now, updated_at=now,
    )  # fmt: skip
    logger.info("triage run %s finished: %s", run.id, summary)
    return "finished" if finished else "claim_lost"


def as_dict(run: TriageRun) -> dict:
    return {
        "id": str(run.id),
        "space_id": str(run.space_id),
        "state": run.state,
        "attempt": run.attempt,
        "revision": run.revision,
        "limit": run.row_limit,
        "summary": run.summary,
        "attempt_count": run.attempt_count,
        "error": {"code": run.error_code, "message": run.error_message} if run.error_code else None,
        "requester": run.provenance(),
        "request_fingerprint": run.request_fingerprint,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "completed_at": run.completed_at.isoformat() if run.completed_at else None,
    }
