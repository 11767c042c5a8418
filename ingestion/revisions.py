"""Document revisions: a replacement compiles beside the published version and swaps on success.

Every admission creates a :class:`~ingestion.models.DocumentRevision` (its source object, name,
type, size and SHA-256) and a compilation job bound to it. The document's published version is
its ``active_revision`` with ``active_generation`` (the job that built the visible nodes); a
replacement's revision is a *candidate* while its job runs, and queries keep answering from the
active one. Publishing the candidate's job (ingestion.compilation.publish) swaps both in the
one transaction that moves the space's publication head by compare-and-set, and the document
takes the revision's name, type, size, hash and source key; the previous source object is
deleted after that commit. A candidate that fails leaves the active revision serving; it is
listed as ``failed`` in ``GET …/documents/{id}/revisions``.

The public state is derived, never stored: ``active`` (the document's active revision),
``superseded`` (published once, replaced since; or replaced by a newer candidate before it
published), ``candidate`` (its job is live), ``failed`` or ``canceled`` (its job ended so).
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from ingestion.models import (
    LIVE_RUN_STATES,
    CompilationJob,
    Document,
    DocumentRevision,
    RunState,
)
from knowledgefs import storage

logger = logging.getLogger("knowledgefs.revisions")


def revision_key(document: Document, revision_id: uuid.UUID) -> str:
    """Object key of a replacement's source bytes: ids only, never the filename."""
    return (
        f"tenants/{document.tenant_id}/spaces/{document.space_id}/documents/{document.id}"
        f"/revisions/{revision_id}/source"
    )


def create_revision(
    document: Document,
    *,
    filename: str,
    mime_type: str,
    size_bytes: int,
    sha256: str,
    storage_key: str,
    revision_id: uuid.UUID | None = None,
) -> DocumentRevision:
    """The document's next revision (number = last + 1); call inside the admission's
    transaction, holding the document's row lock for a replacement."""
    last = document.revisions.aggregate(last=Max("number"))["last"] or 0
    return DocumentRevision.objects.create(
        id=revision_id or uuid.uuid4(),
        document=document,
        number=last + 1,
        filename=filename,
        mime_type=mime_type,
        size_bytes=size_bytes,
        sha256=sha256,
        storage_key=storage_key,
    )


def bind_job(revision: DocumentRevision, job: CompilationJob) -> None:
    """Make ``job`` the attempt compiling ``revision`` (also a manual retry's new attempt)."""
    CompilationJob.objects.filter(id=job.id).update(revision=revision)
    DocumentRevision.objects.filter(id=revision.id).update(job=job)
    job.revision = revision
    revision.job = job


class Source:
    """What a job compiles: its revision's source, or (a job of before revisions) the
    document's own."""

    def __init__(self, job: CompilationJob) -> None:
        origin = job.revision if job.revision_id else job.document
        # A compiled job has its document (deleting the document cancels its jobs first).
        assert origin is not None
        self.id = job.document_id
        self.storage_key = origin.storage_key
        self.mime_type = origin.mime_type
        self.size_bytes = origin.size_bytes
        self.filename = origin.filename


#: The document columns a published revision sets (``Document`` field → revision attribute).
SWAPPED_FIELDS = (
    ("active_revision", "id"),
    ("filename", "filename"),
    ("mime_type", "mime_type"),
    ("size_bytes", "size_bytes"),
    ("sha256", "sha256"),
    ("storage_key", "storage_key"),
)


def swap_published(
    jobs: list[CompilationJob], current_keys: dict
) -> tuple[dict[uuid.UUID, dict], list[str]]:
    """At publication, inside its transaction (documents locked): each published job's revision
    becomes its document's active one. ``current_keys`` maps each document id to its source key
    as locked. Returns ``({document_id: {field: value}}, orphaned keys)``: the columns the
    publication's one document UPDATE sets (:data:`SWAPPED_FIELDS`), and the source keys no
    longer referenced, to delete after the commit. The revisions are marked published by one
    UPDATE; jobs of before revisions carry none and change nothing."""
    by_document = {
        job.document_id: job.revision_id
        for job in jobs
        if job.revision_id and job.document_id is not None  # (published: it has its document)
    }
    if not by_document:
        return {}, []
    found = {r.id: r for r in DocumentRevision.objects.filter(id__in=by_document.values())}
    swapped: dict[uuid.UUID, dict] = {}
    orphaned: list[str] = []
    for document_id, revision_id in by_document.items():
        revision = found.get(revision_id)
        if revision is None or document_id not in current_keys:
            continue
        if current_keys[document_id] != revision.storage_key:
            orphaned.append(current_keys[document_id])
        swapped[document_id] = {name: getattr(revision, attr) for name, attr in SWAPPED_FIELDS}
    if swapped:
        DocumentRevision.objects.filter(
            id__in=[fields["active_revision"] for fields in swapped.values()]
        ).update(published_at=timezone.now())
    return swapped, orphaned


def delete_sources_after_commit(keys: list[str]) -> None:
    """Delete replaced source objects once the swap committed (best effort: a failure leaves
    an unreferenced object the storage sweep reports)."""
    if not keys:
        return

    def delete() -> None:
        for key in keys:
            if Document.objects.filter(storage_key=key).exists():
                continue
            if DocumentRevision.objects.filter(
                storage_key=key, job__run_state__in=LIVE_RUN_STATES
            ).exists():
                continue  # still the source a live job compiles
            try:
                storage.delete_object(key)
            except Exception as exc:  # noqa: BLE001 - reported by the storage sweep
                logger.warning(
                    "could not delete a replaced source object: %s",
                    getattr(exc, "code", type(exc).__name__),
                )

    transaction.on_commit(delete)


def state_of(revision: DocumentRevision, document: Document, job_state: str | None) -> str:
    """The public state of ``revision`` (see the module docstring)."""
    if document.active_revision_id == revision.id:
        return "active"
    if revision.published_at is not None:
        return "superseded"
    if job_state in LIVE_RUN_STATES:
        return "candidate"
    if job_state == RunState.FAILED:
        return "failed"
    if job_state == RunState.CANCELED:
        return "canceled"
    return "superseded"


def revisions_of(document: Document) -> list[dict]:
    """The document's revisions, newest first, each with its derived state and its job's
    error (a failed candidate says why)."""
    rows = list(document.revisions.select_related("job").order_by("-number"))
    listed = []
    for revision in rows:
        job = revision.job
        listed.append(
            {
                "id": str(revision.id),
                "number": revision.number,
                "state": state_of(revision, document, job.run_state if job else None),
                "filename": revision.filename,
                "mime_type": revision.mime_type,
                "size_bytes": revision.size_bytes,
                "sha256": revision.sha256,
                "job_id": str(job.id) if job else None,
                "error_code": (job.error_code or None) if job else None,
                "error_message": (job.error_message or None) if job else None,
                "created_at": revision.created_at.isoformat(),
                "published_at": revision.published_at.isoformat()
                if revision.published_at
                else None,
            }
        )
    return listed
