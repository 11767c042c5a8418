"""Claims, fenced writes and the recovery sweep of triage runs: a configuration of the jobs
kernel :class:`knowledgefs.jobs.claims.ClaimedRunQueue`, exactly as replay runs
(:mod:`.replay_dispatch`), sharing their settings: a claim never delivered is taken back after
``KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS``; a run whose delivery has not written for
``KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS`` (the worker was killed) is put back to ``queued`` and
dispatched (rows it labelled stay labelled: the next delivery takes only the ones still
``pending-triage``), or failed ``attempts_exhausted`` after
``KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS`` deliveries. The sweep runs every minute from the
registered schedule :data:`SWEEP`.
"""

from __future__ import annotations

import logging

from knowledgefs.jobs import claims, schedules

from .models import TriageRun

logger = logging.getLogger("knowledgefs.quality")

RUN_TASK = "retrieval.quality.tasks.run_triage"
SWEEP_TASK = "retrieval.quality.tasks.sweep_triage_runs"
SWEEP_SCHEDULE = "knowledgefs.quality.triage_sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)
DELIVERY_TIMEOUT_SECONDS = 3600


def _failed_fields(code: str, message: str, now) -> dict:
    return {"error_code": code[:64], "error_message": message[:4000], "completed_at": now}


QUEUE = claims.ClaimedRunQueue(
    model=TriageRun,
    state_field="state",
    queued="queued",
    running="running",
    failed="failed",
    task_path=RUN_TASK,
    group="triage",
    logger=logger,
    publish_error="could not publish triage run %s; releasing the claim",
    sweep_label="triage run sweep",
    grace_setting="KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS",
    stale_setting="KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS",
    attempts_setting="KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS",
    timeout=lambda _pk: DELIVERY_TIMEOUT_SECONDS,
    failed_fields=_failed_fields,
    exhausted_message=lambda run: (
        f"the triage was started {run.attempt_count} times without finishing (the worker was "
        "killed, timed out or lost); start a new one once the cause is fixed"
    ),
    begin_fields=lambda now: {"started_at": now},
    load=lambda pk: TriageRun.objects.select_related("space").get(id=pk),
)

dispatch = QUEUE.dispatch
dispatch_on_commit = QUEUE.dispatch_on_commit
begin = QUEUE.begin
held = QUEUE.held
fail = QUEUE.fail
sweep = QUEUE.sweep
ClaimLost = claims.ClaimLost
