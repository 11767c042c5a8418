"""Claims, fenced writes and the recovery sweep of research tasks.

The same shapes as the staged upgrade run (:mod:`upgrades.services.dispatch`):

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
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from knowledgefs.claims import SweepReport, locked_batch

from .models import ResearchTask, RunState, Stage

logger = logging.getLogger("knowledgefs.research_tasks")

RUN_TASK = "retrieval.research_tasks.tasks.run_research_task"
SWEEP_TASK = "retrieval.research_tasks.tasks.sweep_research_tasks"
SWEEP_SCHEDULE = "knowledgefs.research_tasks.sweep"
DELIVERY_MARGIN_SECONDS = 30
"""A delivery's django-q2 timeout is the task's ``timeout_ms`` plus this margin (persisting the
result and the partials after the Research budget ran out)."""
UNCLAIMED_SETTLE_SECONDS = 5
"""An unclaimed ``queued`` task is dispatched by the sweep only once unchanged this long, so the
sweep does not race the on-commit dispatch of the request that queued it."""
MAX_ERROR_MESSAGE_CHARS = 4000


class ClaimLost(Exception):
    """A fenced write found the task no longer ``running`` under this delivery's ``task_id``
    (canceled, taken back by the sweep, or deleted with its space)."""


# --- claim and publish --------------------------------------------------------------------------


def dispatch(task_pk: uuid.UUID | str) -> str | None:
    """Claim a ``queued`` unclaimed task with a fresh delivery id, commit, then publish it.

    Returns the delivery id, or ``None`` when there was nothing to claim or the publish failed
    (the claim is then released so the sweep can try again). Must run outside a transaction
    unless the broker is the ORM (its message is a row of the same transaction).
    """
    if connection.in_atomic_block and not settings.Q_CLUSTER.get("orm"):
        raise RuntimeError("dispatch() must run after the commit: use dispatch_on_commit()")
    delivery = uuid.uuid4().hex
    now = timezone.now()
    claimed = ResearchTask.objects.filter(
        id=task_pk, run_state=RunState.QUEUED, task_id__isnull=True
    ).update(task_id=delivery, claimed_at=now, updated_at=now)
    if not claimed:
        return None
    return delivery if _publish(task_pk, delivery) else None


def dispatch_on_commit(task_pk: uuid.UUID | str) -> None:
    """Dispatch once the surrounding transaction commits (``robust``: a failure is logged, the
    task stays ``queued`` and the sweep dispatches it)."""
    transaction.on_commit(lambda: dispatch(task_pk), robust=True)


def delivery_timeout_seconds(limits: dict | None) -> int:
    """The django-q2 timeout of one delivery in seconds: the task's ``timeout_ms`` (default
    ``KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS``) rounded up, plus :data:`DELIVERY_MARGIN_SECONDS`."""
    timeout_ms = (limits or {}).get("timeout_ms") or settings.KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS
    return math.ceil(timeout_ms / 1000) + DELIVERY_MARGIN_SECONDS


def _publish(task_pk, delivery: str) -> bool:
    from django_q.tasks import async_task

    limits = ResearchTask.objects.filter(id=task_pk).values_list("limits", flat=True).first()
    try:
        async_task(
            RUN_TASK,
            str(task_pk),
            delivery,
            task_name=f"research:{delivery}",
            group="research",
            timeout=delivery_timeout_seconds(limits),
        )
    except Exception:  # noqa: BLE001 - the broker failed: release our claim, the sweep retries
        logger.exception("could not publish research task %s; releasing the claim", task_pk)
        release_claim(task_pk, delivery)
        return False
    return True


def release_claim(task_pk, delivery: str) -> bool:
    """Clear the claim only if the task is still ``queued`` under ``delivery``."""
    return bool(
        ResearchTask.objects.filter(id=task_pk, run_state=RunState.QUEUED, task_id=delivery).update(
            task_id=None, claimed_at=None, updated_at=timezone.now()
        )
    )


# --- delivery start and fenced writes ------------------------------------------------------------


def begin(task_pk, delivery: str) -> ResearchTask | None:
    """Start a delivery: compare-and-set ``queued`` → ``running`` with this ``delivery`` id.

    Sets ``stage`` to ``planning`` (or keeps the progress a checkpoint implies: the runner
    updates it), ``step_started_at``/``heartbeat_at`` to now, ``started_at`` on the first start,
    and counts ``attempt_count``. Returns the running task, or ``None`` for a stale, duplicate
    or canceled delivery (nothing written).
    """
    try:
        task_uuid = uuid.UUID(str(task_pk))
    except ValueError:
        return None
    now = timezone.now()
    started = ResearchTask.objects.filter(
        id=task_uuid, run_state=RunState.QUEUED, task_id=delivery
    ).update(
        run_state=RunState.RUNNING,
        stage=Stage.PLANNING,
        step_started_at=now,
        heartbeat_at=now,
        attempt_count=F("attempt_count") + 1,
        updated_at=now,
    )
    if not started:
        return None
    ResearchTask.objects.filter(id=task_uuid, started_at__isnull=True).update(started_at=now)
    return ResearchTask.objects.select_related("space").get(id=task_uuid)


def held(task_pk, delivery: str):
    """The queryset matching the task only while this delivery owns it."""
    return ResearchTask.objects.filter(id=task_pk, run_state=RunState.RUNNING, task_id=delivery)


def fail(task_pk, delivery: str, code: str, message: str, *, condition: Q | None = None) -> bool:
    """Fail the task with ``code`` (≤ 64 characters) and ``message`` (≤ 4,000) only while this
    delivery owns it (and ``condition`` holds); clears the claim, keeps the checkpoint (a resume
    continues from it). Returns whether the task was failed."""
    now = timezone.now()
    rows = held(task_pk, delivery)
    if condition is not None:
        rows = rows.filter(condition)
    return bool(
        rows.update(
            run_state=RunState.FAILED,
            stage=Stage.FAILED,
            task_id=None,
            claimed_at=None,
            step_started_at=None,
            error_code=code[:64],
            error_message=message[:MAX_ERROR_MESSAGE_CHARS],
            finished_at=now,
            updated_at=now,
        )
    )


# --- the sweep ----------------------------------------------------------------------------------


def sweep(*, batch: int = 200, now=None) -> SweepReport:
    """One pass of the research tasks' recovery (every minute from the django-q2 schedule).

    * ``queued`` with a claim older than ``KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS``
      (claimed, never delivered): the claim is cleared by compare-and-set on the same id and the
      task dispatched through a fresh claim; a late copy of the old message is refused by
      :func:`begin`.
    * ``running`` whose delivery started more than ``KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS`` ago
      (longer than any delivery may run: its worker was killed or lost): failed
      ``attempts_exhausted`` once ``KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS`` deliveries started,
      else put back to ``queued`` without a claim and dispatched; the next delivery resumes from
      the checkpoint.
    * ``queued`` without a claim, unchanged for a few seconds: dispatched.

    Every change is a compare-and-set, rows are read under ``FOR UPDATE SKIP LOCKED`` where the
    database has it, so concurrent sweeps never act on one task twice.
    """
    now = now or timezone.now()
    report = SweepReport()
    to_dispatch: list[uuid.UUID] = []
    grace = timedelta(seconds=settings.KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS)
    stale = timedelta(seconds=settings.KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS)
    with transaction.atomic():
        for task in locked_batch(
            ResearchTask.objects.filter(
                run_state=RunState.QUEUED, task_id__isnull=False, claimed_at__lt=now - grace
            ),
            batch,
        ):
            if release_claim(task.id, task.task_id):
                report.undelivered_reclaimed += 1
                to_dispatch.append(task.id)
    with transaction.atomic():
        for task in locked_batch(
            ResearchTask.objects.filter(run_state=RunState.RUNNING).filter(
                Q(step_started_at__lt=now - stale) | Q(step_started_at__isnull=True)
            ),
            batch,
        ):
            if task.attempt_count >= settings.KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS:
                if fail(
                    task.id,
                    task.task_id,
                    "attempts_exhausted",
                    f"the task was started {task.attempt_count} times without finishing (the "
                    "worker was killed, timed out or lost); resume it once the cause is fixed",
                ):
                    report.attempts_exhausted += 1
            elif held(task.id, task.task_id).update(
                run_state=RunState.QUEUED,
                stage=Stage.QUEUED,
                task_id=None,
                claimed_at=None,
                step_started_at=None,
                updated_at=now,
            ):
                report.stale_requeued += 1
                to_dispatch.append(task.id)
    to_dispatch.extend(
        ResearchTask.objects.filter(
            run_state=RunState.QUEUED,
            task_id__isnull=True,
            updated_at__lt=now - timedelta(seconds=UNCLAIMED_SETTLE_SECONDS),
        )
        .exclude(id__in=to_dispatch)
        .order_by("updated_at")
        .values_list("id", flat=True)[:batch]
    )
    for task_pk in dict.fromkeys(to_dispatch):
        if dispatch(task_pk):
            report.dispatched += 1
    if any(report.as_dict().values()):
        logger.info("research task sweep: %s", report.as_dict())
    return report


def ensure_sweep_schedule():
    """Create or repair the django-q2 schedule running :func:`sweep` every minute; returns it.
    Migration ``retrieval.0006_research_tasks`` creates the same row."""
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
