"""Dispatch without a gap: claim a queued job with a delivery id, then put it on the queue.

:func:`dispatch` claims a ``queued`` attempt that has no task id by writing a fresh delivery id
in its own committed transaction, then enqueues ``(job id, delivery id)``; if enqueueing fails
the claim is released, but only if it still holds our delivery id. Nothing is enqueued without a
claim. Also the django-q2 schedule of the recovery sweep.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ingestion.models import CompilationJob, RunState
from knowledgefs.jobs import schedules

logger = logging.getLogger("knowledgefs.compilation")


TASK_FUNCTION = "ingestion.tasks.compile_document"


def enqueue_on_commit(job_id: uuid.UUID) -> None:
    """Dispatch the job once the surrounding transaction commits.

    ``robust``: a queue failure after the commit is logged, never raised into the request that
    already stored the document; the job stays ``queued`` without a claim and the recovery
    sweep dispatches it.
    """
    transaction.on_commit(lambda: dispatch(job_id), robust=True)


def dispatch(job_id: uuid.UUID) -> str | None:
    """Claim a queued, unclaimed job with a fresh delivery id, then put it on the queue.

    Returns the delivery id, or ``None`` when the job was not ``queued`` without a claim or the
    queue refused it (the claim is then released so the sweep can try again).
    """
    if connection.in_atomic_block and not settings.Q_CLUSTER.get("orm"):
        # A message on another broker would be visible before the claim commits.
        raise RuntimeError("dispatch() must run after the commit: use enqueue_on_commit()")
    delivery = uuid.uuid4().hex
    with transaction.atomic():
        claimed = CompilationJob.objects.filter(
            id=job_id, run_state=RunState.QUEUED, task_id=""
        ).update(task_id=delivery, dispatched_at=timezone.now(), updated_at=timezone.now())
    if not claimed:
        return None
    return delivery if _enqueue(job_id, delivery) else None


def _enqueue(job_id: uuid.UUID, delivery: str) -> bool:
    """Put ``(job id, delivery id)`` on the queue; on failure release the claim if still ours."""
    from django_q.tasks import async_task

    try:
        async_task(
            TASK_FUNCTION,
            str(job_id),
            delivery,
            task_name=f"compile:{delivery}",
            group="compile",
        )
    except Exception:  # noqa: BLE001 - the broker failed: release our claim, the sweep retries
        logger.exception("could not enqueue job %s; releasing the claim", job_id)
        CompilationJob.objects.filter(
            id=job_id, run_state=RunState.QUEUED, task_id=delivery
        ).update(task_id="", dispatched_at=None, updated_at=timezone.now())
        return False
    return True


RECOVERY_SCHEDULE = "knowledgefs.recover_jobs"
RECOVERY = schedules.Schedule(
    RECOVERY_SCHEDULE,
    "ingestion.tasks.recover_jobs",
    seconds_setting="KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS",
)
"""The recovery sweep every ``KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS`` rounded up to whole minutes
(the unit of django-q2 schedules), registered by ``IngestionConfig.ready()``; migration
``ingestion.0003`` creates the same row."""


def ensure_recovery_schedule():
    """Create or repair the recovery sweep's django-q2 schedule (:data:`RECOVERY`); returns it."""
    return schedules.ensure(RECOVERY_SCHEDULE)
