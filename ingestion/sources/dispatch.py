"""Claims, fenced writes and the recovery sweep of source runs: a configuration of the jobs
kernel :class:`knowledgefs.jobs.claims.ClaimedRunQueue` (as replay and triage runs).

* claim before enqueue (``QUEUE.dispatch``, ``QUEUE.dispatch_on_commit``), only once due
  (``retry_at``: the back-off after a retryable Dify failure);
* start (``QUEUE.begin``): ``queued`` → ``running`` with the delivery's own ``task_id``;
* fenced writes (``QUEUE.held``, ``QUEUE.fail``): each item's result is written only while the run
  is ``running`` under that ``task_id``;
* sweep (``QUEUE.sweep``, every minute from :data:`SWEEP`): a claim never delivered, a run whose
  delivery has not written for ``KNOWLEDGE_SOURCE_RUN_STALE_SECONDS`` (the worker was killed)
  put back to ``queued`` and dispatched (its finished items kept: the next delivery runs only
  the pending ones), or failed ``attempts_exhausted`` after
  ``KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS`` deliveries.
"""

from __future__ import annotations

import logging

from django.db.models import Q

from knowledgefs.jobs import claims, schedules

from .models import SourceRun

logger = logging.getLogger("knowledgefs.sources")

RUN_TASK = "ingestion.tasks.run_source"
SWEEP_TASK = "ingestion.tasks.sweep_source_runs"
SWEEP_SCHEDULE = "knowledgefs.sources.run_sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)
DUE_TASK = "ingestion.tasks.start_due_source_syncs"
DUE_SCHEDULE = "knowledgefs.sources.due_syncs"
DUE = schedules.Schedule(DUE_SCHEDULE, DUE_TASK)
DELIVERY_TIMEOUT_SECONDS = 3600


def _failed_fields(code: str, message: str, now) -> dict:
    return {"error_code": code[:64], "error_message": message[:4000], "completed_at": now}


QUEUE = claims.ClaimedRunQueue(
    model=SourceRun,
    state_field="state",
    queued="queued",
    running="running",
    failed="failed",
    task_path=RUN_TASK,
    group="source-run",
    logger=logger,
    publish_error="could not publish source run %s; releasing the claim",
    sweep_label="source run sweep",
    grace_setting="KNOWLEDGE_SOURCE_RUN_DISPATCH_GRACE_SECONDS",
    stale_setting="KNOWLEDGE_SOURCE_RUN_STALE_SECONDS",
    attempts_setting="KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS",
    timeout=lambda _pk: DELIVERY_TIMEOUT_SECONDS,
    failed_fields=_failed_fields,
    exhausted_message=lambda run: (
        f"the source run was started {run.attempt_count} times without finishing (the worker "
        "was killed, timed out or lost, or Dify kept failing); retry it once the cause is fixed"
    ),
    due=lambda now: Q(retry_at__isnull=True) | Q(retry_at__lte=now),
    begin_fields=lambda now: {"started_at": now, "retry_at": None},
    load=lambda pk: SourceRun.objects.select_related("source", "space").get(id=pk),
)

ClaimLost = claims.ClaimLost
