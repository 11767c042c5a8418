"""Document admission, listing and deletion.

Admission checks everything before any byte is stored: filename, size
(``KNOWLEDGE_UPLOAD_MAX_BYTES``), type sniffed from content, duplicate content in the space.
Then one transaction writes the document and its compilation job; the object is written first
and deleted again if the transaction fails, so nothing is left half-written.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ingestion import parsing, revisions
from ingestion.models import (
    LIVE_RUN_STATES,
    CompilationJob,
    Document,
    DocumentState,
    KnowledgeNode,
    ParseArtifact,
    RunState,
    Stage,
)
from ingestion.projection import projector
from knowledgefs import storage
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from knowledgefs.errors import UnsupportedMediaType as UnsupportedMediaTypeError
from knowledgefs.uploads import upload_limit_message
from spaces.models import KnowledgeSpace, PublicationHead
from spaces.services import Principal, get_space

logger = logging.getLogger("knowledgefs.documents")

MAX_FILENAME_CHARS = 512
DUPLICATE_POLICIES = ("reject", "replace")


@dataclass(frozen=True)
class StoredSource:
    """Source bytes already in object storage under ``key``, to become document ``document_id``."""

    document_id: uuid.UUID
    key: str


@dataclass(frozen=True)
class Admission:
    """The result of admitting a file: the document, its new job, and whether it is new."""

    document: Document
    job: CompilationJob
    created: bool


def validate_filename(filename: str) -> str:
    """Return the filename unchanged if it can be shown and stored as metadata.

    Path separators, ``..``, spaces and any script are fine (the name never becomes a path).
    Refused with 400 ``invalid_filename``: empty names, names over 512 characters, and names with
    control characters (the message names the code point, e.g. ``U+0000``).
    """
    if not filename or not filename.strip():
        raise InvalidInput("filename is empty", code="invalid_filename")
    if len(filename) > MAX_FILENAME_CHARS:
        raise InvalidInput(
            f"filename is {len(filename)} characters; the limit is {MAX_FILENAME_CHARS}",
            code="invalid_filename",
        )
    for char in filename:
        category = unicodedata.category(char)
        if category in ("Cc", "Cs") or char in "\u2028\u2029":
            raise InvalidInput(
                f"filename contains the control character U+{ord(char):04X}; rename the file",
                code="invalid_filename",
            )
    return filename


def check_file(filename: str, data: bytes) -> tuple[str, str]:
    """Check a file before anything is stored; returns ``(mime_type, sha256 hex)``.

    400 ``invalid_filename`` / ``empty_file``, 413 ``file_too_large``, 415
    ``unsupported_media_type`` / ``content_mismatch`` (codes: docs/api.md).
    """
    validate_filename(filename)
    if not data:
        raise InvalidInput("the file is empty (0 bytes)", code="empty_file")
    limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
    if len(data) > limit:
        raise PayloadTooLarge(upload_limit_message(limit))
    try:
        mime_type = parsing.sniff_mime_type(data, filename)
    except parsing.UnsupportedType as exc:
        # unsupported_media_type, or content_mismatch (a .pdf/.docx/... name on other content)
        raise UnsupportedMediaTypeError(
            exc.message,
            code=exc.code,
            details={"supported": supported_types(), "detected": exc.mime_type},
        ) from exc
    except parsing.ParseError as exc:
        raise InvalidInput(exc.message, code=exc.code) from exc
    return mime_type, hashlib.sha256(data).hexdigest()


def replace_document(
    document: Document,
    *,
    filename: str,
    data: bytes,
    enqueue: bool = True,
    stored: StoredSource | None = None,
    bind: Callable[[Document, CompilationJob], None] | None = None,
) -> Admission:
    """New content for an existing document: a candidate revision and its job.

    The published revision keeps answering until the candidate's job publishes; then one
    transaction swaps them (ingestion.revisions). The same bytes as the document's are a
    recompilation (:func:`_replace`); bytes another document of the space holds are 409
    ``duplicate_document``. A live candidate is superseded by this one. ``stored`` names bytes
    already written (an upload session's object), else they are written under a revision key;
    ``bind`` runs in the transaction, as for :func:`admit_document`.
    """
    mime_type, sha256 = check_file(filename, data)
    space = document.space
    _freeze_embedding_model(space)
    if sha256 == document.sha256:
        replaced = _replace(document, filename=filename, enqueue=enqueue, bind=bind)
        if replaced is None:
            raise NotFound("document not found", code="document_not_found")
        return replaced
    other = Document.objects.filter(space=space, sha256=sha256).exclude(id=document.id).first()
    if other is not None:
        raise _duplicate(other)
    revision_id = uuid.uuid4()
    key = stored.key if stored else revisions.revision_key(document, revision_id)
    if stored is None:
        storage.put_object(key, data)
    try:
        from ingestion.compilation.operations import supersede_live_jobs

        with transaction.atomic():
            locked = lock_for_update(Document.objects.filter(id=document.id)).first()
            if locked is None:
                raise NotFound("document not found", code="document_not_found")
            superseded = list(
                CompilationJob.objects.filter(
                    document=locked, run_state__in=LIVE_RUN_STATES, revision__isnull=False
                )
                .exclude(revision__storage_key=locked.storage_key)
                .values_list("revision__storage_key", flat=True)
            )
            supersede_live_jobs(locked)
            if locked.active_generation is None:
                locked.state = DocumentState.QUEUED
                locked.save(update_fields=["state", "updated_at"])
            job = _new_job(locked, enqueue=enqueue)
            revisions.bind_job(
                revisions.create_revision(
                    locked,
                    filename=filename,
                    mime_type=mime_type,
                    size_bytes=len(data),
                    sha256=sha256,
                    storage_key=key,
                    revision_id=revision_id,
                ),
                job,
            )
            if bind is not None:
                bind(locked, job)
            # a candidate replaced before it published: its source is no longer needed
            revisions.delete_sources_after_commit(superseded)
    except BaseException:
        if stored is None:
            _discard_object(key, document.id)
        raise
    return Admission(document=locked, job=job, created=False)


def storage_key_for(space: KnowledgeSpace, document_id: uuid.UUID) -> str:
    """Object key of a document's source bytes: ids only, never the filename."""
    return f"tenants/{space.tenant_id}/spaces/{space.id}/documents/{document_id}/source"


def admit_document(
    space: KnowledgeSpace,
    *,
    filename: str,
    data: bytes,
    on_duplicate: str = "reject",
    metadata: dict | None = None,
    enqueue: bool = True,
    stored: StoredSource | None = None,
    bind: Callable[[Document, CompilationJob], None] | None = None,
) -> Admission:
    """Store a file in ``space`` and queue its compilation; returns an :class:`Admission`.

    Nothing is stored when it raises (codes: docs/api.md). The same bytes already in the space
    are refused with ``on_duplicate="reject"``; with ``"replace"`` the existing document takes
    the new filename and is compiled again (it stays one document). A space
    ``pending-validation`` is admitted: its compilation validates it.
    ``enqueue=False`` leaves the job queued in the database without a queue message, for callers
    that compile in-process (:func:`ingestion.compilation.recovery.drain_queued`).

    A failing object storage raises its :class:`~knowledgefs.dify.errors.ObjectStorageError`;
    the object is deleted again first (best effort), so no object is left without its document.

    ``stored`` admits bytes already written (an upload session's object): the document takes
    that id and key, nothing is written, and the object is left to the caller on failure.
    ``bind(document, job)`` runs inside the transaction that writes them, before the job is
    dispatched (an upload session records its result there, so both commit or neither).
    """
    if on_duplicate not in DUPLICATE_POLICIES:
        raise InvalidInput(
            f"on_duplicate must be one of {', '.join(DUPLICATE_POLICIES)}",
            code="invalid_on_duplicate",
        )
    mime_type, sha256 = check_file(filename, data)
    _freeze_embedding_model(space)

    existing = Document.objects.filter(space=space, sha256=sha256).first()
    if existing is not None:
        if on_duplicate == "reject":
            raise _duplicate(existing)
        replaced = _replace(existing, filename=filename, enqueue=enqueue, bind=bind)
        if replaced is not None:
            return replaced
        # The document was deleted since we found it: admit the bytes as a new document.

    document_id = stored.document_id if stored else uuid.uuid4()
    key = stored.key if stored else storage_key_for(space, document_id)
    try:
        # Inside the try: a PUT that fails after Dify stored the bytes (the answer dropped or
        # late, a timeout) must not leave an object no document row points at.
        if stored is None:
            storage.put_object(key, data)
        with transaction.atomic():
            document = Document.objects.create(
                id=document_id,
                tenant_id=space.tenant_id,
                space=space,
                filename=filename,
                mime_type=mime_type,
                size_bytes=len(data),
                sha256=sha256,
                storage_key=key,
                metadata=metadata or {},
            )
            job = _new_job(document, enqueue=enqueue)
            revisions.bind_job(
                revisions.create_revision(
                    document,
                    filename=filename,
                    mime_type=mime_type,
                    size_bytes=len(data),
                    sha256=sha256,
                    storage_key=key,
                ),
                job,
            )
            if bind is not None:
                bind(document, job)
    except IntegrityError:
        if stored is not None:
            raise  # the caller owns the object (and the same id may have been admitted)
        _discard_object(key, document_id)
        # A concurrent upload of the same bytes won the unique (space, sha256) race.
        winner = Document.objects.filter(space=space, sha256=sha256).first()
        if winner is None:
            raise
        if on_duplicate == "reject":
            raise _duplicate(winner) from None
        replaced = _replace(winner, filename=filename, enqueue=enqueue, bind=bind)
        if replaced is None:
            raise Conflict(
                "a concurrent upload and deletion of the same content raced; send it again",
                code="concurrent_change",
            ) from None
        return replaced
    except BaseException:
        if stored is None:
            _discard_object(key, document_id)
        raise
    return Admission(document=document, job=job, created=True)


def _discard_object(key: str, document_id: uuid.UUID) -> None:
    """Best effort: delete the object of an admission that failed, never masking its error.

    A failure here is logged with the document id and the storage's error code only (no key,
    no bytes, no Dify message). A PUT Dify is still processing when this DELETE arrives can
    still store its object afterwards; nothing here can see that.
    """
    try:
        storage.delete_object(key)
    except Exception as exc:  # noqa: BLE001 - the admission's own error is the one to raise
        logger.warning(
            "could not delete the object of failed upload %s: %s",
            document_id,
            getattr(exc, "code", type(exc).__name__),
        )


def supported_types() -> list[str]:
    return sorted(parsing.SUPPORTED_MIME_TYPES)


def _duplicate(existing: Document) -> Conflict:
    return Conflict(
        f"the same file content is already in this knowledge space as document {existing.id} "
        f"({existing.filename!r}); pass on_duplicate=replace to replace it",
        code="duplicate_document",
        details={"existing_document_id": str(existing.id)},
    )


def _replace(
    existing: Document, *, filename: str, enqueue: bool, bind: Callable | None = None
) -> Admission | None:
    """Recompile ``existing`` under ``filename``; ``None`` if it was deleted meanwhile."""
    from ingestion.compilation.operations import supersede_live_jobs

    with transaction.atomic():
        document = lock_for_update(Document.objects.filter(id=existing.id)).first()
        if document is None:
            return None
        supersede_live_jobs(document)
        document.filename = filename
        if document.active_generation is None:
            document.state = DocumentState.QUEUED
        document.error_code = ""
        document.error_message = ""
        document.save(
            update_fields=["filename", "state", "error_code", "error_message", "updated_at"]
        )
        job = _new_job(document, enqueue=enqueue)
        # The same bytes: a candidate revision over the document's own source object.
        revisions.bind_job(
            revisions.create_revision(
                document,
                filename=filename,
                mime_type=document.mime_type,
                size_bytes=document.size_bytes,
                sha256=document.sha256,
                storage_key=document.storage_key,
            ),
            job,
        )
        if bind is not None:
            bind(document, job)
    return Admission(document=document, job=job, created=False)


def _new_job(document: Document, *, enqueue: bool) -> CompilationJob:
    from ingestion.compilation.dispatch import enqueue_on_commit

    job = CompilationJob.objects.create(
        tenant_id=document.tenant_id, space_id=document.space_id, document=document
    )
    if enqueue and settings.KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME == "inline":
        from ingestion.compilation.recovery import compile_inline

        # single-process development: this process compiles it once the admission committed
        transaction.on_commit(lambda: compile_inline(job.id), robust=True)
    elif enqueue:
        enqueue_on_commit(job.id)
    return job


def _freeze_embedding_model(space: KnowledgeSpace) -> None:
    """Check the space's readiness and freeze its embedding profile (a latch) at its first
    admission (:func:`spaces.profiles.freeze_for_admission`).

    409 ``space_setup_required`` or ``space_validation_failed`` refuse the upload before
    anything is stored. A ready space gets its index version 1 (its profile's model) now; a
    space pending validation gets it from the preflight its first compilation runs. Later model
    changes go through :func:`retrieval.index_versions.change_embedding_model`, never an upload.
    """
    from spaces.profiles import freeze_for_admission

    freeze_for_admission(space)
    space.refresh_from_db(fields=["embedding_model_id", "embedding_dimension"])


def documents_in(space: KnowledgeSpace) -> QuerySet[Document]:
    """Documents of a space, newest first."""
    return Document.objects.filter(space=space).order_by("-created_at", "-id")


def get_document(principal: Principal, space_id, document_id) -> Document:
    """A document of a space the principal can reach, else 404 ``document_not_found``."""
    space = get_space(principal, space_id)
    return Document.objects.get_in_space(space, document_id, what="document")


MAX_TEXT_SLICE = 1_000_000


def published_text(
    principal: Principal, space_id, document_id, *, start: int = 0, end: int | None = None
) -> dict:
    """The published canonical text of a document, or a slice of it, for checking citations.

    Citation offsets are half-open code-point offsets into this text. Returns ``{"document_id",
    "length", "start", "end", "text"}``; at most 1,000,000 characters per call. A disabled
    document is never served (its metadata stays readable on the document routes), nor one
    before its first publication.
    """
    from ingestion.chunking import canonical_text
    from ingestion.parsing import Element

    document = get_document(principal, space_id, document_id)
    if not document.enabled:
        raise Conflict(
            "the document is disabled and its content is not served; enable it first "
            "(PATCH the document with enabled: true)",
            code="document_disabled",
        )
    if document.active_generation is None:
        raise Conflict("the document has no published version yet", code="document_not_published")
    artifact = ParseArtifact.objects.get(job_id=document.active_generation)
    elements = [
        Element(**{**e, "section_path": tuple(e["section_path"])}) for e in artifact.elements
    ]
    text, _ = canonical_text(elements)
    end = len(text) if end is None else end
    if not 0 <= start <= end <= len(text) or end - start > MAX_TEXT_SLICE:
        raise InvalidInput(
            f"start and end must satisfy 0 <= start <= end <= {len(text)} and cover at most "
            f"{MAX_TEXT_SLICE} characters",
            code="invalid_range",
        )
    return {
        "document_id": str(document.id),
        "length": len(text),
        "start": start,
        "end": end,
        "text": text[start:end],
    }


def get_job(principal: Principal, job_id) -> CompilationJob:
    """A compilation job in a space the principal can reach, else 404 ``job_not_found``."""
    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError:
        raise NotFound("job not found", code="job_not_found") from None
    # The caller's scope is part of the query, so an out-of-scope job is never loaded.
    jobs = CompilationJob.objects.select_related("document").filter(
        id=job_uuid, tenant_id=principal.tenant_id
    )
    if principal.space_ids is not None:
        jobs = jobs.filter(space_id__in=principal.space_ids)
    job = jobs.first()
    if job is None:
        raise NotFound("job not found", code="job_not_found")
    return job


def delete_document(principal: Principal, space_id, document_id) -> None:
    """Delete a document: its jobs stop counting, its nodes leave every index, its bytes go."""
    document = get_document(principal, space_id, document_id)
    purge_documents(Document.objects.filter(id=document.id))


def purge_documents(documents: QuerySet[Document]) -> int:
    """Delete documents with their stored objects, nodes and projections; returns the count.

    Document by document, the stored objects go first (the images its parse artifacts
    reference, then the source: one DELETE each; a missing object counts as deleted), then the
    rows in one transaction: its live jobs are canceled (a worker still holding one loses its
    lease and writes nothing more), its nodes leave every index, and the space's publication
    head moves so that cached indexes are rebuilt. The attempts the delete canceled stay
    readable (``canceled``, ``error_code`` ``document_deleted``, ``document_id`` null); the
    document's ended attempts go with it. When the storage fails,
    its error (an ``OSError``; under Dify an :class:`~knowledgefs.dify.errors.ObjectStorageError`,
    answered 503 ``storage_unavailable`` when a retry may succeed) is raised with that document's
    rows and every later document intact, so the same delete can simply be sent again; nothing
    is left with rows gone and its object kept.
    """
    remove_nodes = projector().remover()
    deleted = 0
    for document in documents.only("id", "storage_key", "space_id"):
        # Its parse artifacts' images first (they are only reachable through these rows).
        for assets in ParseArtifact.objects.filter(document=document).values_list(
            "assets", flat=True
        ):
            for asset in assets or []:
                storage.delete_object(asset["key"])
        # Replaced, failed and candidate revisions' sources, then its own (each object once).
        keys = set(document.revisions.values_list("storage_key", flat=True))
        for key in sorted(keys - {document.storage_key}):
            storage.delete_object(key)
        storage.delete_object(document.storage_key)
        with transaction.atomic():
            # Lock order everywhere: the document row first, then its jobs.
            if not lock_for_update(Document.objects.filter(id=document.id)).exists():
                continue
            _cancel_for_deletion(document)
            remove_nodes(
                list(KnowledgeNode.objects.filter(document=document).values_list("id", flat=True))
            )
            document.delete()
            PublicationHead.objects.advance(document.space_id)
        deleted += 1
    return deleted


def _cancel_for_deletion(document: Document) -> None:
    """Cancel the document's live attempts (a worker still holding one loses its lease and
    writes nothing more) and delete its ended ones; the canceled ones outlive the document."""
    now = timezone.now()
    message = f"canceled: its document {document.id} was deleted"
    live = CompilationJob.objects.filter(document=document, run_state__in=LIVE_RUN_STATES)
    canceled = []
    for job in live.only("id", "progress"):
        canceled.append(job.id)
        CompilationJob.objects.filter(id=job.id).update(
            run_state=RunState.CANCELED,
            stage=Stage.CANCELED,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            finished_at=now,
            updated_at=now,
            error_code="document_deleted",
            error_message=message,
            error_retryable=False,
            progress={**(job.progress or {}), "phase": "canceled", "operation": "canceled"},
        )
    CompilationJob.objects.filter(document=document).exclude(id__in=canceled).delete()
