"""Recovery: the sweep that re-dispatches or fails attempts that lost their way, and the
in-process drain.

Rows are taken in bounded batches (``SELECT … FOR UPDATE SKIP LOCKED`` where the database has
it) and every state change is a compare-and-set, so two sweeps never act on one job twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ingestion.compilation.dispatch import _enqueue, dispatch
from ingestion.compilation.failures import fail
from ingestion.compilation.generations import _drop_nodes
from ingestion.compilation.pipeline import compile_jobs
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.models import CompilationJob, KnowledgeNode, RunState
from ingestion.projection import projector

logger = logging.getLogger("knowledgefs.compilation")


@dataclass
class SweepReport:
    """What one recovery sweep did (counts of jobs)."""

    redispatched_undelivered: int = 0
    requeued_expired: int = 0
    failed_expired: int = 0
    retries_due: int = 0
    dispatched: int = 0
    orphan_nodes_removed: int = 0
    index_builds: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _locked_batch(qs, batch: int) -> list[CompilationJob]:
    """Up to ``batch`` rows of ``qs`` locked for this transaction (skipping locked ones)."""
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True)
    else:
        qs = qs.select_for_update()
    return list(qs.order_by("updated_at")[:batch])


def _timeout_recorded(task_id: str) -> bool:
    """Whether django-q2 recorded the delivery ``task_id`` as failed by its timeout."""
    from django_q.models import Task

    if not task_id:
        return False
    result = (
        Task.objects.filter(name=f"compile:{task_id}", success=False)
        .values_list("result", flat=True)
        .first()
    )
    return bool(result) and "timeout" in str(result).lower()


def recover_jobs(*, batch: int = 200, now=None) -> SweepReport:
    """The recovery sweep: re-dispatch or fail every attempt that lost its way.

    * ``queued`` with a claim older than ``KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS`` (claimed but
      never delivered: the broker lost it, or the dispatcher died between claim and enqueue):
      enqueued again with the same delivery id, so a message that was only delayed still works
      and whichever copy arrives first does the job (the claim is a compare-and-set).
    * ``queued`` without a claim for more than a few seconds (a failed enqueue): dispatched.
    * ``running`` with an expired lease (the worker died or hangs): failed as ``timeout`` if
      django-q2 recorded the delivery as timed out, failed as ``worker_lost`` once
      ``KNOWLEDGE_JOB_MAX_ATTEMPTS`` deliveries started, else put back to ``queued`` (the next
      delivery resumes from the last checkpoint). Each action re-checks that the lease is
      still expired, so a worker that renewed it meanwhile keeps its job.
    * nodes left by attempts that ended without publishing (see :func:`_remove_orphan_nodes`).
    * ``retry_wait`` whose ``next_attempt_at`` passed: back to ``queued``.

    Rows are taken in bounded batches with ``SELECT … FOR UPDATE SKIP LOCKED`` where the
    database has it, and every state change is a compare-and-set, so two sweeps never act on
    one job twice. Returns a :class:`SweepReport`.
    """
    now = now or timezone.now()
    report = SweepReport()
    grace = timedelta(seconds=settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS)
    to_dispatch: list[uuid.UUID] = []
    to_redeliver: list[tuple[uuid.UUID, str]] = []
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(
                run_state=RunState.QUEUED, dispatched_at__lt=now - grace
            ).exclude(task_id=""),
            batch,
        ):
            if CompilationJob.objects.filter(
                id=job.id, run_state=RunState.QUEUED, task_id=job.task_id
            ).update(dispatched_at=now, updated_at=now):
                to_redeliver.append((job.id, job.task_id))
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(
                run_state__in=[RunState.QUEUED, RunState.DISPATCH_PENDING],
                task_id="",
                updated_at__lt=now - timedelta(seconds=5),
            ),
            batch,
        ):
            CompilationJob.objects.filter(id=job.id, task_id="").update(
                run_state=RunState.QUEUED, updated_at=now
            )
            to_dispatch.append(job.id)
    expired = []
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(run_state=RunState.RUNNING).filter(
                Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
            ),
            batch,
        ):
            expired.append(
                (job.id, job.lease_token, job.task_id, job.execution_attempts, job.stage)
            )
    # Every action re-checks that the lease is still expired: a worker that renewed it since
    # (a slow keeper) keeps its job.
    still_expired = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
    for job_id, token, task_id, attempts, stage in expired:
        # (A running job always holds a lease token; a ``None`` one matches no lease, so
        # fail() could not have ended it either.)
        if _timeout_recorded(task_id):
            if token is not None and fail(
                job_id,
                token,
                "timeout",
                "compilation exceeded the worker timeout",
                condition=still_expired,
            ):
                report.failed_expired += 1
        elif attempts >= settings.KNOWLEDGE_JOB_MAX_ATTEMPTS:
            if token is not None and fail(
                job_id,
                token,
                "worker_lost",
                f"the worker stopped {attempts} times while compiling this document "
                "(killed, out of memory or restarted); retry it when the cause is fixed",
                retryable=True,
                condition=still_expired,
            ):
                report.failed_expired += 1
        elif CompilationJob.objects.filter(
            still_expired, id=job_id, run_state=RunState.RUNNING, lease_token=token
        ).update(
            run_state=RunState.QUEUED,
            lease_token=None,
            lease_expires_at=None,
            worker_id="",
            task_id="",
            dispatched_at=None,
            updated_at=now,
            progress=_progress(
                "queued", "the worker stopped; queued again", PROGRESS.get(stage, 0)
            ),
            progress_percent=PROGRESS.get(stage, 0),
        ):
            report.requeued_expired += 1
            to_dispatch.append(job_id)
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(run_state=RunState.RETRY_WAIT, next_attempt_at__lte=now),
            batch,
        ):
            if CompilationJob.objects.filter(id=job.id, run_state=RunState.RETRY_WAIT).update(
                run_state=RunState.QUEUED, task_id="", next_attempt_at=None, updated_at=now
            ):
                report.retries_due += 1
                to_dispatch.append(job.id)
    for job_id in dict.fromkeys(to_dispatch):
        if dispatch(job_id):
            report.dispatched += 1
    for job_id, delivery in to_redeliver:
        if _enqueue(job_id, delivery):
            report.redispatched_undelivered += 1
    report.orphan_nodes_removed = _remove_orphan_nodes(batch=batch * 25)
    report.index_builds = _recover_index_builds()
    if any(report.as_dict().values()):
        logger.info("recovery sweep: %s", report.as_dict())
    return report


def _remove_orphan_nodes(*, batch: int) -> int:
    """Remove up to ``batch`` nodes (with projections) of attempts that ended without publishing.

    Normally an ending attempt removes its own nodes; a worker killed right after a django-q2
    timeout may leave them. They are invisible to queries; this only reclaims the space.
    """
    ended = CompilationJob.objects.filter(
        run_state__in=[RunState.FAILED, RunState.CANCELED, RunState.SUPERSEDED]
    ).values("id")
    ids = list(
        KnowledgeNode.objects.filter(generation__in=ended)
        .exclude(generation=F("document__active_generation"))
        .values_list("id", flat=True)[:batch]
    )
    if ids:
        with transaction.atomic():
            _drop_nodes(KnowledgeNode.objects.filter(id__in=ids))
    return len(ids)


def _recover_index_builds() -> int:
    return projector().recover_builds()


def drain_queued(
    space_id: uuid.UUID | None = None,
    *,
    document_ids: list | None = None,
    on_progress=None,
    wait_for_retries: bool = True,
) -> int:
    """Compile every queued job in-process (for ``kfs ingest --wait`` and evaluation).

    Jobs are taken in batches of ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS``; a job a worker cluster
    claims first is simply skipped; ``document_ids`` limits the drain to those documents' jobs.
    With ``wait_for_retries`` a job in ``retry_wait`` is waited
    for and compiled again when due (attempts are bounded, so this ends). ``on_progress(n)`` is
    called with the number of jobs done in each batch. Returns how many deliveries were made.
    """
    done = 0
    batch_size = settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS
    scope = CompilationJob.objects.all()
    if space_id is not None:
        scope = scope.filter(space_id=space_id)
    if document_ids is not None:
        scope = scope.filter(document_id__in=document_ids)
    while True:
        qs = scope.filter(run_state=RunState.QUEUED)
        oldest = qs.order_by("created_at").values_list("space_id", flat=True).first()
        # One space per batch: a batch shares one set of embedding targets.
        batch = list(
            qs.filter(space_id=oldest)
            .order_by("created_at")
            .values_list("id", flat=True)[:batch_size]
        )
        if batch:
            compile_jobs(batch)
            done += len(batch)
            if on_progress:
                on_progress(len(batch))
            continue
        due = scope.filter(run_state=RunState.RETRY_WAIT).order_by("next_attempt_at").first()
        if not wait_for_retries or due is None:
            return done
        pause = (due.next_attempt_at - timezone.now()).total_seconds() if due.next_attempt_at else 0
        time.sleep(min(max(pause, 0.0), 60.0))
        scope.filter(run_state=RunState.RETRY_WAIT, next_attempt_at__lte=timezone.now()).update(
            run_state=RunState.QUEUED, task_id="", next_attempt_at=None, updated_at=timezone.now()
        )


def compile_inline(job_id: uuid.UUID) -> int:
    """Compile the job's document in this process (``KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME=
    inline``: single-process development); returns the deliveries made. A job another process
    took already is skipped."""
    document_id = CompilationJob.objects.filter(id=job_id).values_list("document_id", flat=True)
    return drain_queued(document_ids=list(document_id), wait_for_retries=False)
