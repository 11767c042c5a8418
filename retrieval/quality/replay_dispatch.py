"""Claims, fenced writes and the recovery sweep of replay runs: a configuration of the jobs
kernel :class:`knowledgefs.jobs.claims.ClaimedRunQueue` (as research tasks and upgrade jobs).

* claim before enqueue (:func:`dispatch`, :func:`dispatch_on_commit`);
* start (:func:`begin`): ``queued`` → ``running`` with the delivery's own ``task_id``;
* fenced writes (:func:`held`, :func:`fail`): each item's result is written only while the run
  is ``running`` under that ``task_id`` (a cancel or a sweep that took it back makes them match
  nothing);
* sweep (:func:`sweep`, every minute from the registered schedule :data:`SWEEP`): a claim never
  delivered, a run whose delivery has not written for ``KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS``
  (the worker was killed) put back to ``queued`` and dispatched (its finished items are kept:
  the next delivery runs only the pending ones), or failed ``attempts_exhausted`` after
  ``KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS`` deliveries.
"""

from __future__ import annotations

import logging

from knowledgefs.jobs import claims, schedules

from .models import ReplayRun

logger = logging.getLogger("knowledgefs.quality")

RUN_TASK = "retrieval.quality.tasks.run_replay"
SWEEP_TASK = "retrieval.quality.tasks.sweep_replay_runs"
SWEEP_SCHEDULE = "knowledgefs.quality.replay_sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)
DELIVERY_TIMEOUT_SECONDS = 3600


def _failed_fields(code: str, message: str, now) -> dict:
    return {"error_code": code[:64], "error_message": message[:4000], "completed_at": now}


QUEUE = claims.ClaimedRunQueue(
    model=ReplayRun,
    state_field="state",
    queued="queued",
    running="running",
    failed="failed",
    task_path=RUN_TASK,
    group="replay",
    logger=logger,
    publish_error="could not publish replay run %s; releasing the claim",
    sweep_label="replay run sweep",
    grace_setting="KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS",
    stale_setting="KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS",
    attempts_setting="KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS",
    timeout=lambda _pk: DELIVERY_TIMEOUT_SECONDS,
    failed_fields=_failed_fields,
    exhausted_message=lambda run: (
        f"the replay was started {run.attempt_count} times without finishing (the worker was "
        "killed, timed out or lost); retry it once the cause is fixed"
    ),
    begin_fields=lambda now: {"started_at": now},
    load=lambda pk: ReplayRun.objects.select_related("space").get(id=pk),
)

dispatch = QUEUE.dispatch
dispatch_on_commit = QUEUE.dispatch_on_commit
begin = QUEUE.begin
held = QUEUE.held
fail = QUEUE.fail
sweep = QUEUE.sweep
ClaimLost = claims.ClaimLost
