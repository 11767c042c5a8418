"""Operator and API actions on jobs: cancel, retry, and superseding a document's live jobs.

Each runs in one transaction that locks the document row first, then its jobs; a canceled or
superseded job's lease is revoked in the same commit, so its worker writes nothing more.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone

from ingestion.compilation.dispatch import enqueue_on_commit
from ingestion.compilation.generations import _drop_generation, _drop_nodes
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.models import (
    LIVE_RUN_STATES,
    CompilationJob,
    Document,
    DocumentRevision,
    DocumentState,
    KnowledgeNode,
    ParseArtifact,
    RunState,
    Stage,
)
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, NotFound

TERMINAL_RUN_STATES = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELED,
    RunState.SUPERSEDED,
)


def supersede_live_jobs(document: Document) -> int:
    """Mark a document's live jobs superseded and remove what they built so far.

    Call inside a transaction holding the document's row lock. A worker still running one of
    these jobs loses its lease: its next checkpoint finds the job no longer ``running`` and it
    writes nothing more.
    """
    live = list(
        CompilationJob.objects.filter(document=document, run_state__in=LIVE_RUN_STATES).values_list(
            "id", flat=True
        )
    )
    if not live:
        return 0
    now = timezone.now()
    CompilationJob.objects.filter(id__in=live).update(
        run_state=RunState.SUPERSEDED,
        lease_token=None,
        lease_expires_at=None,
        finished_at=now,
        updated_at=now,
    )
    for generation in live:
        if generation != document.active_generation:
            _drop_generation(document.id, generation)
    return len(live)


def _job_for_update(job_id) -> CompilationJob:
    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError:
        raise NotFound("job not found", code="job_not_found") from None
    row = CompilationJob.objects.filter(id=job_uuid).values_list("document_id", flat=True)
    if not row.exists():
        raise NotFound("job not found", code="job_not_found")
    document_id = row.first()  # None once its document was deleted
    # Lock order everywhere: the document row first, then its jobs.
    if document_id is not None:
        lock_for_update(Document.objects.filter(id=document_id)).first()
    job = CompilationJob.objects.select_for_update().filter(id=job_uuid).first()
    if job is None:
        raise NotFound("job not found", code="job_not_found")
    return job


def cancel_job(job_id) -> CompilationJob:
    """Cancel a live attempt; returns it ``canceled``.

    The attempt's lease is revoked in the same commit, so the worker (if any) writes nothing
    more: its next lease check, at most one embedding batch later, finds the job gone, and any
    checkpoint or finish it tries is refused. Nodes and projections it built are removed; the
    document keeps its published generation if it has one, else becomes ``canceled``.

    Raises :class:`NotFound`, or :class:`Conflict` (409) when the attempt already ended.
    """
    with transaction.atomic():
        job = _job_for_update(job_id)
        if job.run_state in TERMINAL_RUN_STATES:
            raise Conflict(
                f"job {job.id} already ended as {job.run_state}; nothing to cancel",
                code="job_finished",
            )
        now = timezone.now()
        CompilationJob.objects.filter(id=job.id).update(
            run_state=RunState.CANCELED,
            stage=Stage.CANCELED,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            finished_at=now,
            updated_at=now,
            error_code="canceled",
            error_message="canceled by request",
            error_retryable=False,
            progress={**(job.progress or {}), "phase": "canceled", "operation": "canceled"},
        )
        if job.document_id is not None:  # (a deleted document left nothing to drop)
            _drop_nodes(
                KnowledgeNode.objects.filter(document_id=job.document_id, generation=job.id)
            )
            Document.objects.filter(id=job.document_id, active_generation__isnull=True).update(
                state=DocumentState.CANCELED, updated_at=now
            )
    job.refresh_from_db()
    return job


def retry_job(job_id, *, from_checkpoint: bool = True) -> CompilationJob:
    """Start a new attempt for a failed or canceled one; returns the new ``queued`` attempt.

    With ``from_checkpoint`` the new attempt takes over the previous attempt's parse artifact
    (the last checkpoint kept after a failure) and starts at ``parsed``; chunks and vectors are
    always rebuilt, because a failed attempt's partial nodes are removed. The new attempt links
    to the old one (``retry_of``) and is dispatched after the commit.

    Raises :class:`NotFound`, or :class:`Conflict` (409) for an attempt still live, already
    published, or replaced by a newer upload or attempt.
    """
    with transaction.atomic():
        job = _job_for_update(job_id)
        if job.run_state in LIVE_RUN_STATES:
            raise Conflict(f"job {job.id} is still {job.run_state}", code="job_live")
        if job.run_state == RunState.SUCCEEDED:
            raise Conflict(f"job {job.id} already succeeded", code="job_succeeded")
        if job.document_id is None:
            raise Conflict(
                f"job {job.id} was canceled because its document was deleted; upload it again",
                code="document_deleted",
            )
        newer = CompilationJob.objects.filter(
            document_id=job.document_id, created_at__gt=job.created_at
        )
        if job.run_state == RunState.SUPERSEDED or newer.exists():
            raise Conflict(
                f"job {job.id} was replaced by a newer attempt of its document",
                code="job_superseded",
            )
        attempt = CompilationJob.objects.create(
            tenant_id=job.tenant_id,
            space_id=job.space_id,
            document_id=job.document_id,
            retry_of=job,
            attempt_number=job.attempt_number + 1,
            revision_id=job.revision_id,  # the same source bytes
        )
        if job.revision_id:
            DocumentRevision.objects.filter(id=job.revision_id).update(job=attempt)
        if from_checkpoint and ParseArtifact.objects.filter(job_id=job.id).update(job=attempt):
            CompilationJob.objects.filter(id=attempt.id).update(
                stage=Stage.PARSED,
                progress_percent=PROGRESS[Stage.PARSED],
                progress=_progress(
                    "parsed", "resumed from the parse checkpoint", PROGRESS[Stage.PARSED]
                ),
            )
        Document.objects.filter(id=job.document_id, active_generation__isnull=True).update(
            state=DocumentState.QUEUED, updated_at=timezone.now()
        )
        Document.objects.filter(id=job.document_id).update(error_code="", error_message="")
        enqueue_on_commit(attempt.id)
    attempt.refresh_from_db()
    return attempt
