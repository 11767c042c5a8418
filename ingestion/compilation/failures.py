"""Ending an attempt that failed: retry later, fail for good, or record a worker timeout.

Every write is conditioned on the job's lease token, so a job that is no longer ours (canceled,
superseded, taken over) is left to whoever took it. A failed attempt's partial nodes are
removed with it; its parse artifact is kept so a retry resumes from ``parsed``.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ingestion.compilation.errors import CompilationFailure, LeaseLost
from ingestion.compilation.generations import _drop_nodes
from ingestion.compilation.leases import Held, _checkpoint, _checkpoint_many, _held_by, _requeue
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.models import CompilationJob, Document, DocumentState, KnowledgeNode, RunState, Stage
from knowledgefs.db import lock_for_update

logger = logging.getLogger("knowledgefs.compilation")


def _stop_on_timeout(held: Held) -> None:
    """Record a django-q2 timeout fast (the guard kills the worker seconds later).

    A delivery that held one job fails it as ``timeout``. A delivery that held several puts them
    all back to ``queued`` instead: a job that already started is then delivered alone, so a
    document that really needs longer than the timeout fails on its own run and its batch-mates
    are not charged for it. One or two statements, conditioned on the lease tokens; a failed
    attempt's invisible partial nodes are removed by the sweep's cleanup.
    """
    message = f"compilation exceeded the worker timeout of {settings.Q_CLUSTER['timeout']} s"
    now = timezone.now()
    try:
        if len(held.tokens) != 1:
            _requeue(held, list(held.tokens))
            return
        CompilationJob.objects.filter(_held_by(held.tokens), run_state=RunState.RUNNING).update(
            run_state=RunState.FAILED,
            stage=Stage.FAILED,
            lease_token=None,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
            error_code="timeout",
            error_message=message,
            error_retryable=False,
        )
        Document.objects.filter(
            jobs__id__in=list(held.tokens), active_generation__isnull=True
        ).update(state=DocumentState.FAILED, error_code="timeout", error_message=message)
    except Exception:  # noqa: BLE001 - the sweep finds the expired leases and the timeout record
        logger.exception("could not record the timeout of a compilation batch")


def _end_all(held: Held, job_ids: list[uuid.UUID], failure: CompilationFailure) -> None:
    """End these held jobs with one failure (the model runtime failed them all): retried later
    when it is retryable, else failed at once."""
    for job_id in job_ids:
        end_attempt(job_id, held.tokens[job_id], failure)
        held.release(job_id)


def end_attempt(job_id: uuid.UUID, token: uuid.UUID, failure: CompilationFailure) -> str | None:
    """Fail the attempt or, for a retryable failure with attempts left, put it in retry_wait.

    Returns the new run state, or ``None`` when the job was no longer ours.
    """
    row = (
        CompilationJob.objects.filter(id=job_id).values_list("execution_attempts", "stage").first()
    )
    if row is None:
        return None
    attempts, stage = row
    if failure.retryable and attempts < settings.KNOWLEDGE_JOB_MAX_ATTEMPTS:
        delay = settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS * 2 ** max(0, attempts - 1)
        now = timezone.now()
        if _checkpoint_many(
            {job_id: token},
            run_state=RunState.RETRY_WAIT,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            next_attempt_at=now + timedelta(seconds=delay),
            progress=_progress(
                "retry_wait", f"{failure.code}; retrying after {delay} s", PROGRESS.get(stage, 0)
            ),
            error_code=failure.code[:64],
            error_message=failure.message[:4000],
            error_retryable=True,
        ):
            return RunState.RETRY_WAIT
        return None
    message = failure.message
    if failure.retryable:
        message += f" (gave up after {attempts} attempts)"
    return (
        RunState.FAILED
        if fail(job_id, token, failure.code, message, retryable=failure.retryable)
        else None
    )


def fail(
    job_id: uuid.UUID,
    token: uuid.UUID,
    code: str,
    message: str,
    *,
    retryable: bool = False,
    condition: Q | None = None,
) -> bool:
    """End a job as failed (if we still hold it) and remove its partial nodes and projections.

    The parse artifact is kept, so a manual retry resumes from the ``parsed`` checkpoint.
    ``condition`` must also hold on the job row (the sweep passes "lease still expired").
    Returns ``False`` when the job is no longer ours (superseded, canceled, deleted): whoever
    took it over owns the cleanup.
    """
    now = timezone.now()
    row = (
        CompilationJob.objects.filter(id=job_id)
        .values_list("document_id", "progress_percent")
        .first()
    )
    if row is None:
        return False
    document_id, percent = row
    try:
        with transaction.atomic():
            lock_for_update(Document.objects.filter(id=document_id)).first()  # lock order
            _checkpoint(
                job_id,
                token,
                condition=condition,
                stage=Stage.FAILED,
                run_state=RunState.FAILED,
                finished_at=now,
                lease_token=None,
                lease_expires_at=None,
                error_code=code[:64],
                error_message=message[:4000],
                error_retryable=retryable,
                progress=_progress("failed", code, percent),
            )
            _drop_nodes(KnowledgeNode.objects.filter(document_id=document_id, generation=job_id))
            Document.objects.filter(id=document_id, active_generation__isnull=True).update(
                state=DocumentState.FAILED, updated_at=now
            )
            Document.objects.filter(id=document_id).update(
                error_code=code[:64], error_message=message[:4000]
            )
    except LeaseLost:
        return False
    return True
