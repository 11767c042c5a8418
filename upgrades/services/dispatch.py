"""Claims, fenced writes and the sweep of the staged run (docs/upgrades.md, "Staged run").

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
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from knowledgefs.claims import SweepReport, locked_batch
from upgrades.models import JobStatus, UpgradeJob

logger = logging.getLogger("knowledgefs.upgrades")

STEP_TASK = "upgrades.tasks.run_upgrade_step"
SWEEP_TASK = "upgrades.tasks.sweep_upgrades"
SWEEP_SCHEDULE = "knowledgefs.upgrades.sweep"
MAX_ERROR_MESSAGE_CHARS = 4000
"""``last_error_message`` is truncated to this many characters (the reference's 4,000)."""
UNCLAIMED_SETTLE_SECONDS = 5
"""An unclaimed ``queued`` job is dispatched by the sweep only once it has been unchanged this
long, so the sweep does not race the on-commit dispatch of the request that just queued it."""


class ClaimLost(Exception):
    """A fenced write found the job no longer ``running`` under this delivery's ``task_id``."""


def _now():
    return timezone.now()


# --- claim and publish --------------------------------------------------------------------------


def dispatch(job_id: uuid.UUID | str, *, now=None) -> str | None:
    """Claim the job for one delivery, commit, then publish it (I1-I3).

    Returns the delivery's ``task_id``, or ``None`` when there was nothing to claim (not
    ``queued``, already claimed, or ``next_step_at`` still in the future) or the publish failed
    (the claim is then released, so the sweep can dispatch it again). ``now`` is the sweep's
    clock (the due check of ``next_step_at``). Must run outside a
    transaction (use :func:`dispatch_on_commit` inside one): a claim that has not committed
    yet must never be visible to a worker as a message (with the ORM broker the message is a
    row of the same transaction, so it is allowed there).
    """
    if connection.in_atomic_block and not settings.Q_CLUSTER.get("orm"):
        # A message on another broker would be visible before the claim commits.
        raise RuntimeError("dispatch() must run after the commit: use dispatch_on_commit()")
    task_id = uuid.uuid4().hex
    now = now or _now()
    claimed = (
        UpgradeJob.objects.filter(id=job_id, status=JobStatus.QUEUED, task_id__isnull=True)
        .filter(Q(next_step_at__isnull=True) | Q(next_step_at__lte=now))
        .update(task_id=task_id, claimed_at=now, updated_at=now)
    )
    if not claimed:
        return None
    return task_id if _publish(job_id, task_id) else None


def dispatch_on_commit(job_id: uuid.UUID | str) -> None:
    """Dispatch the job once the surrounding transaction commits (``robust``: a failure is
    logged, the job stays ``queued`` and the sweep dispatches it)."""
    transaction.on_commit(lambda: dispatch(job_id), robust=True)


def _broker():
    """The broker for step messages: ``KNOWLEDGE_UPGRADE_BROKER_CLASS`` when set (a dotted
    django-q2 broker class, instantiated per publish), else ``None`` (the cluster's broker)."""
    dotted = getattr(settings, "KNOWLEDGE_UPGRADE_BROKER_CLASS", "")
    return import_string(dotted)() if dotted else None


def _publish(job_id, task_id: str) -> bool:
    """Publish ``(job id, task id)``; on failure release the claim if it is still ours (I2)."""
    from django_q.tasks import async_task

    try:
        options = {
            "task_name": f"upgrade:{task_id}",
            "group": "upgrade",
            "timeout": settings.KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS,
        }
        broker = _broker()
        if broker is not None:
            options["broker"] = broker
        async_task(STEP_TASK, str(job_id), task_id, **options)
    except Exception:  # noqa: BLE001 - the broker failed: release our claim, the sweep retries
        logger.exception("could not publish upgrade step of job %s; releasing the claim", job_id)
        release_claim(job_id, task_id)
        return False
    return True


def release_claim(job_id, task_id: str) -> bool:
    """Clear the claim only if the job is still ``queued`` under ``task_id``; a foreign id or a
    job that moved on is left alone. Returns whether the claim was released."""
    return bool(
        UpgradeJob.objects.filter(id=job_id, status=JobStatus.QUEUED, task_id=task_id).update(
            task_id=None, claimed_at=None, updated_at=_now()
        )
    )


# --- delivery start and fenced writes ------------------------------------------------------------


def begin(job_id, task_id: str) -> UpgradeJob | None:
    """Start a delivery: compare-and-set ``queued`` → ``running`` with this ``task_id`` (I7).

    Counts the attempt (``attempt_count`` counts the deliveries of the current step; a
    checkpoint resets it) and extends the job's unreleased file leases to now + 7 days. Returns
    the running job, or ``None`` for a stale or duplicate delivery, which wrote nothing.
    """
    from django.db.models import F

    from .leases import extend_leases

    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError:
        return None
    now = _now()
    with transaction.atomic():
        started = UpgradeJob.objects.filter(
            id=job_uuid, status=JobStatus.QUEUED, task_id=task_id
        ).update(
            status=JobStatus.RUNNING,
            step_started_at=now,
            attempt_count=F("attempt_count") + 1,
            updated_at=now,
        )
        if not started:
            return None
        extend_leases(job_uuid, now)
    return UpgradeJob.objects.get(id=job_uuid)


def held(job_id, task_id: str):
    """The queryset matching the job only while this delivery owns it (I8)."""
    return UpgradeJob.objects.filter(id=job_id, status=JobStatus.RUNNING, task_id=task_id)


def checkpoint(job_id, task_id: str, *, delay_seconds: int = 0, **fields) -> None:
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


def fail(job_id, task_id: str, code: str, message: str) -> bool:
    """Fail the job with ``code`` and ``message`` (truncated to 4,000 characters) only while this
    delivery owns it (I8, G3: a stale worker cannot fail a healthy job). Clears the claim and
    sets ``completed_at``. Returns whether the job was failed."""
    now = _now()
    return bool(
        held(job_id, task_id).update(
            status=JobStatus.FAILED,
            task_id=None,
            claimed_at=None,
            step_started_at=None,
            next_step_at=None,
            last_error_code=code[:128],
            last_error_message=message[:MAX_ERROR_MESSAGE_CHARS],
            completed_at=now,
            updated_at=now,
        )
    )


# --- the sweep ----------------------------------------------------------------------------------


def sweep(*, batch: int = 200, now=None) -> SweepReport:
    """One pass of the staged run's recovery (scheduled every minute; ``kfs upgrade sweep``).

    * ``queued`` with a claim older than ``KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS`` (claimed,
      never delivered: the dispatcher died between claim and publish, or the broker lost the
      message; G1): the claim is cleared by compare-and-set on the same id, then dispatched
      through a fresh claim. A late copy of the old message is refused by :func:`begin`.
    * ``running`` with ``step_started_at`` older than ``KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS``
      (the worker died; G2): failed ``attempts_exhausted`` once the step was started
      ``KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS`` times, else put back to ``queued`` without a claim
      (compare-and-set on the same id) and dispatched.
    * ``queued`` without a claim whose ``next_step_at`` is due or absent: dispatched.

    Rows are read in bounded batches under ``FOR UPDATE SKIP LOCKED`` where available; every
    change is a compare-and-set, so concurrent sweeps never act on one job twice.
    """
    now = now or _now()
    report = SweepReport()
    to_dispatch: list[uuid.UUID] = []
    grace = timedelta(seconds=settings.KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS)
    stale = timedelta(seconds=settings.KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS)
    with transaction.atomic():
        for job in locked_batch(
            UpgradeJob.objects.filter(
                status=JobStatus.QUEUED, task_id__isnull=False, claimed_at__lt=now - grace
            ),
            batch,
        ):
            if release_claim(job.id, job.task_id):
                report.undelivered_reclaimed += 1
                to_dispatch.append(job.id)
    with transaction.atomic():
        for job in locked_batch(
            UpgradeJob.objects.filter(status=JobStatus.RUNNING).filter(
                Q(step_started_at__lt=now - stale) | Q(step_started_at__isnull=True)
            ),
            batch,
        ):
            if job.attempt_count >= settings.KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS:
                if fail(
                    job.id,
                    job.task_id,
                    "attempts_exhausted",
                    f"the {job.stage} step was started {job.attempt_count} times without "
                    "finishing (the worker was killed, timed out or lost); fix the cause and "
                    "retry the upgrade",
                ):
                    report.attempts_exhausted += 1
            elif held(job.id, job.task_id).update(
                status=JobStatus.QUEUED,
                task_id=None,
                claimed_at=None,
                step_started_at=None,
                updated_at=now,
            ):
                report.stale_requeued += 1
                to_dispatch.append(job.id)
    to_dispatch.extend(
        UpgradeJob.objects.filter(status=JobStatus.QUEUED, task_id__isnull=True)
        .filter(Q(next_step_at__isnull=True) | Q(next_step_at__lte=now))
        .filter(updated_at__lt=now - timedelta(seconds=UNCLAIMED_SETTLE_SECONDS))
        .exclude(id__in=to_dispatch)
        .order_by("updated_at")
        .values_list("id", flat=True)[:batch]
    )
    for job_id in dict.fromkeys(to_dispatch):
        if dispatch(job_id, now=now):
            report.dispatched += 1
    if any(report.as_dict().values()):
        logger.info("upgrade sweep: %s", report.as_dict())
    return report


def ensure_sweep_schedule():
    """Create or repair the django-q2 schedule running :func:`sweep` every minute (the unit of
    django-q2 schedules; the bridge specification asks for 30-60 s); returns it. Migration
    ``upgrades.0006_sweep_schedule`` creates the same row."""
    from django_q.models import Schedule

    schedule, _ = Schedule.objects.update_or_create(
        name=SWEEP_SCHEDULE,
        defaults={
            "func": SWEEP_TASK,
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
        },
    )
    return schedule
