"""Claims, fenced writes and the sweep of the staged run (docs/upgrades.md, "Staged run"): a
configuration of :class:`knowledgefs.jobs.claims.ClaimedRunQueue` (the protocol, shared with the
research tasks), exposed as this module's functions, plus the staged run's :func:`checkpoint`.

The step claim is the job's ``task_id`` (bridge specification §3.1-§3.3, invariants I1-I8):

* **claim before enqueue** (:func:`dispatch`): a compare-and-set writes a fresh ``task_id`` and
  ``claimed_at`` on a ``queued`` job without a claim (and without a future ``next_step_at``) and
  commits; only then is the message published carrying that id. A failed publish releases the
  claim conditionally (still ``queued`` with our id); the sweep dispatches it again later.
* **start** (:func:`begin`): a delivery starts only by the compare-and-set ``queued`` →
  ``running`` with its own ``task_id``; anything else (a duplicate, a stale message, a job
  claimed again under a new id, a terminal job) is refused without a single write.
* **fenced writes** (:func:`checkpoint`, :func:`fail`): every checkpoint and every failure is
  conditioned on ``running`` with the delivery's ``task_id``; a checkpoint puts the job back to
  ``queued`` with no claim in the same commit, and the next step is dispatched through the claim
  after that commit (never a bare enqueue).
* **sweep** (:func:`sweep`, every minute from the django-q2 schedule of migration
  ``upgrades.0006``): claims never delivered (G1), running steps older than the step limit
  (G2, capped by ``KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS`` with the dead letter
  ``attempts_exhausted``), and unclaimed queued jobs whose ``next_step_at`` is due (countdowns).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from knowledgefs.jobs import claims, schedules
from knowledgefs.jobs.claims import UNCLAIMED_SETTLE_SECONDS, SweepReport  # noqa: F401
from upgrades.models import JobStatus, UpgradeJob

logger = logging.getLogger("knowledgefs.upgrades")

STEP_TASK = "upgrades.tasks.run_upgrade_step"
SWEEP_TASK = "upgrades.tasks.sweep_upgrades"
SWEEP_SCHEDULE = "knowledgefs.upgrades.sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)
"""The sweep every minute (the unit of django-q2 schedules; the bridge specification asks for
30-60 s), registered by ``UpgradesConfig.ready()``; migration ``upgrades.0006_sweep_schedule``
creates the same row."""
MAX_ERROR_MESSAGE_CHARS = 4000
"""``last_error_message`` is truncated to this many characters (the reference's 4,000)."""


class ClaimLost(claims.ClaimLost):
    """A fenced write found the job no longer ``running`` under this delivery's ``task_id``."""


def _now() -> datetime:
    return timezone.now()


def _broker() -> Any:  # a django-q2 broker (untyped library), or None
    """The broker for step messages: ``KNOWLEDGE_UPGRADE_BROKER_CLASS`` when set (a dotted
    django-q2 broker class, instantiated per publish), else ``None`` (the cluster's broker)."""
    dotted = getattr(settings, "KNOWLEDGE_UPGRADE_BROKER_CLASS", "")
    return import_string(dotted)() if dotted else None


def _due(now: datetime) -> Q:
    """A queued job is claimed only once its ``next_step_at`` (a countdown) is absent or due."""
    return Q(next_step_at__isnull=True) | Q(next_step_at__lte=now)


def _failed_fields(code: str, message: str, now: datetime) -> dict[str, Any]:
    """A failed job has no next step and is completed; ``code`` ≤ 128 characters, ``message``
    ≤ 4,000 (I8, G3: a stale worker cannot fail a healthy job)."""
    return {
        "next_step_at": None,
        "last_error_code": code[:128],
        "last_error_message": message[:MAX_ERROR_MESSAGE_CHARS],
        "completed_at": now,
    }


def _exhausted_message(job: UpgradeJob) -> str:
    return (
        f"the {job.stage} step was started {job.attempt_count} times without "
        "finishing (the worker was killed, timed out or lost); fix the cause and "
        "retry the upgrade"
    )


def _extend_leases(job_uuid: uuid.UUID, now: datetime) -> None:
    """A started delivery extends the job's unreleased file leases to now + 7 days."""
    from .leases import extend_leases

    extend_leases(job_uuid, now)


QUEUE = claims.ClaimedRunQueue(
    model=UpgradeJob,
    state_field="status",
    queued=JobStatus.QUEUED,
    running=JobStatus.RUNNING,
    failed=JobStatus.FAILED,
    task_path=STEP_TASK,
    group="upgrade",
    logger=logger,
    publish_error="could not publish upgrade step of job %s; releasing the claim",
    sweep_label="upgrade sweep",
    grace_setting="KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS",
    stale_setting="KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS",
    attempts_setting="KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS",
    timeout=lambda job_id: settings.KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS,
    broker=_broker,
    failed_fields=_failed_fields,
    exhausted_message=_exhausted_message,
    due=_due,
    after_begin=_extend_leases,
    begin_atomic=True,
)

dispatch = QUEUE.dispatch
"""Claim the job for one delivery (``queued``, unclaimed, ``next_step_at`` due at ``now``),
commit, then publish it (I1-I3); returns the task id or ``None``. Outside a transaction (inside
one: :func:`dispatch_on_commit`)."""
dispatch_on_commit = QUEUE.dispatch_on_commit
_publish = QUEUE._publish
release_claim = QUEUE.release_claim
begin = QUEUE.begin
"""Start a delivery: compare-and-set ``queued`` → ``running`` with this ``task_id`` (I7), in one
transaction with the extension of the job's file leases; returns the job or ``None``."""
held = QUEUE.held
fail = QUEUE.fail
sweep = QUEUE.sweep


def checkpoint(
    job_id: uuid.UUID | str, task_id: str, *, delay_seconds: int = 0, **fields: Any
) -> None:
    """Commit a step's job fields and hand the job back: ``queued``, no claim, attempts reset,
    ``next_step_at`` now + ``delay_seconds`` (None when 0), in one fenced UPDATE (I5, I8).

    Call inside the step's transaction; raises :class:`ClaimLost` (rolling the transaction
    back) when the delivery no longer owns the job. The caller dispatches after the commit.
    """
    now = _now()
    updated = held(job_id, task_id).update(
        **fields,
        status=JobStatus.QUEUED,
        task_id=None,
        claimed_at=None,
        step_started_at=None,
        attempt_count=0,
        next_step_at=now + timedelta(seconds=delay_seconds) if delay_seconds else None,
        updated_at=now,
    )
    if not updated:
        raise ClaimLost(str(job_id))


def ensure_sweep_schedule() -> Any:  # a django_q Schedule row (untyped library)
    """Create or repair the sweep's django-q2 schedule (:data:`SWEEP`); returns it."""
    return schedules.ensure(SWEEP_SCHEDULE)
