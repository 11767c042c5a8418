"""Claims, fenced writes and the recovery sweep of research tasks: a configuration of
:class:`knowledgefs.jobs.claims.ClaimedRunQueue` (the protocol, shared with the staged upgrade run
of :mod:`upgrades.services.dispatch`), exposed as this module's functions:

* **claim before enqueue** (:func:`dispatch`): a compare-and-set writes a fresh ``task_id`` and
  ``claimed_at`` on a ``queued`` task without a claim and commits; only then is ``(task id,
  delivery id)`` published. A failed publish releases the claim if it is still ours; the sweep
  dispatches it again. Inside a transaction use :func:`dispatch_on_commit`.
* **start** (:func:`begin`): a delivery starts only by the compare-and-set ``queued`` →
  ``running`` with its own ``task_id`` (counting ``attempt_count``); a duplicate, stale or
  canceled delivery is refused without a write.
* **fenced writes** (:func:`held`, :func:`fail`): every checkpoint, partial and final write is
  conditioned on ``running`` with the delivery's ``task_id``; a cancel or a sweep that took the
  task back makes them all match nothing (:class:`ClaimLost`).
* **sweep** (:func:`sweep`, every minute from the django-q2 schedule of migration
  ``retrieval.0006``): claims never delivered, running tasks whose delivery started more than
  ``KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS`` ago (the worker was killed: requeued, or failed
  ``attempts_exhausted`` after ``KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS`` started deliveries), and
  unclaimed queued tasks.
"""

from __future__ import annotations

import logging
import math

from django.conf import settings

from knowledgefs.jobs import claims, schedules
from knowledgefs.jobs.claims import UNCLAIMED_SETTLE_SECONDS, SweepReport  # noqa: F401

from .models import ResearchTask, RunState, Stage

logger = logging.getLogger("knowledgefs.research_tasks")

RUN_TASK = "retrieval.research_tasks.tasks.run_research_task"
SWEEP_TASK = "retrieval.research_tasks.tasks.sweep_research_tasks"
SWEEP_SCHEDULE = "knowledgefs.research_tasks.sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)
"""The sweep every minute, registered by ``RetrievalConfig.ready()``; migration
``retrieval.0006_research_tasks`` creates the same row."""
DELIVERY_MARGIN_SECONDS = 30
"""A delivery's django-q2 timeout is the task's ``timeout_ms`` plus this margin (persisting the
result and the partials after the Research budget ran out)."""
MAX_ERROR_MESSAGE_CHARS = 4000


class ClaimLost(claims.ClaimLost):
    """A fenced write found the task no longer ``running`` under this delivery's ``task_id``
    (canceled, taken back by the sweep, or deleted with its space)."""


def delivery_timeout_seconds(limits: dict | None) -> int:
    """The django-q2 timeout of one delivery in seconds: the task's ``timeout_ms`` (default
    ``KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS``) rounded up, plus :data:`DELIVERY_MARGIN_SECONDS`."""
    timeout_ms = (limits or {}).get("timeout_ms") or settings.KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS
    return math.ceil(timeout_ms / 1000) + DELIVERY_MARGIN_SECONDS


def _task_timeout(task_pk) -> int:
    limits = ResearchTask.objects.filter(id=task_pk).values_list("limits", flat=True).first()
    return delivery_timeout_seconds(limits)


def _failed_fields(code: str, message: str, now) -> dict:
    """A failed task keeps its checkpoint (a resume continues from it); ``code`` ≤ 64 characters,
    ``message`` ≤ 4,000."""
    return {
        "stage": Stage.FAILED,
        "error_code": code[:64],
        "error_message": message[:MAX_ERROR_MESSAGE_CHARS],
        "finished_at": now,
    }


def _exhausted_message(task: ResearchTask) -> str:
    return (
        f"the task was started {task.attempt_count} times without finishing (the "
        "worker was killed, timed out or lost); resume it once the cause is fixed"
    )


def _started(task_uuid, now) -> None:
    """``started_at`` is set on the first start only."""
    ResearchTask.objects.filter(id=task_uuid, started_at__isnull=True).update(started_at=now)


QUEUE = claims.ClaimedRunQueue(
    model=ResearchTask,
    state_field="run_state",
    queued=RunState.QUEUED,
    running=RunState.RUNNING,
    failed=RunState.FAILED,
    task_path=RUN_TASK,
    group="research",
    logger=logger,
    publish_error="could not publish research task %s; releasing the claim",
    sweep_label="research task sweep",
    grace_setting="KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS",
    stale_setting="KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS",
    attempts_setting="KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS",
    timeout=_task_timeout,
    failed_fields=_failed_fields,
    exhausted_message=_exhausted_message,
    begin_fields=lambda now: {"stage": Stage.PLANNING, "heartbeat_at": now},
    after_begin=_started,
    load=lambda task_uuid: ResearchTask.objects.select_related("space").get(id=task_uuid),
    requeue_fields={"stage": Stage.QUEUED},
)

dispatch = QUEUE.dispatch
"""Claim a ``queued`` unclaimed task with a fresh delivery id, commit, then publish it; returns
the delivery id or ``None``. Outside a transaction (inside one: :func:`dispatch_on_commit`)."""
dispatch_on_commit = QUEUE.dispatch_on_commit
_publish = QUEUE._publish
release_claim = QUEUE.release_claim
begin = QUEUE.begin
"""Start a delivery (``queued`` → ``running``, ``stage`` ``planning``, ``heartbeat_at`` and the
first ``started_at``); returns the running task or ``None`` (nothing written)."""
held = QUEUE.held
fail = QUEUE.fail
sweep = QUEUE.sweep


def ensure_sweep_schedule():
    """Create or repair the sweep's django-q2 schedule (:data:`SWEEP`); returns it."""
    return schedules.ensure(SWEEP_SCHEDULE)
