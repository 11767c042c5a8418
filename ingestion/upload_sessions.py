"""Upload sessions: a declared file whose bytes arrive in a later request (reference spec §4).

Under the Dify storage bridge and the embedded default there is no presigned or multipart
upload, so every session is ``small_fallback``: the client POSTs exactly the declared bytes to
``…/small-file``, which checks size and SHA-256, writes them through the object storage (the
same port as a multipart upload, :mod:`knowledgefs.storage`) and completes inline.

States: ``creating → ready → completing → completed``; ``ready → aborting → aborted``;
``ready → (sweep) expired``; ``failed`` (integrity mismatch, or an admission refusal such as a
duplicate or an unsupported type), each terminal state with the object deleted (the sweep and
abort delete it before the row leaves ``aborting``, so a failed delete never frees quota
early) and ``reserved_bytes`` zeroed. Status changes are compare-and-set on ``row_version``.

Completion admits the stored bytes through :func:`ingestion.documents.admit_document` (filename,
size, sniffing, duplicate rules) with the session id as the document id and the session's object
as its source, and marks the session ``completed`` in the same transaction that writes the
document and its job, before the job is dispatched. A process killed anywhere in between leaves
the session ``ready`` or ``completing`` with its object stored: completing again resumes, and
the document id (the session id) makes a second document impossible.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from ingestion import documents
from ingestion.models import (
    UPLOAD_TERMINAL,
    CompilationJob,
    Document,
    DocumentRevision,
    UploadSession,
    UploadStatus,
)
from knowledgefs import storage
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput, PayloadTooLarge, ServiceError
from knowledgefs.uploads import upload_limit_message
from spaces.models import KnowledgeSpace

logger = logging.getLogger("knowledgefs.upload_sessions")

MODE = "small_fallback"
MAX_CONTENT_TYPE_CHARS = 255


class IntegrityMismatch(ServiceError):
    """422: the bytes are not the declared size or checksum."""

    status = 422
    code = "upload_integrity_mismatch"


@dataclass(frozen=True)
class Declared:
    """What a create request declares."""

    file_name: str
    content_type: str
    expected_size_bytes: int
    checksum_sha256: str
    on_duplicate: str = "reject"
    target_document_id: uuid.UUID | None = None


def parse_declaration(body: object) -> Declared:
    """Check a create body (400 with the field named, 413 over the per-file limit)."""
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_request")
    file_name = body.get("file_name")
    if not isinstance(file_name, str):
        raise InvalidInput("file_name is required (a string)", code="invalid_filename")
    documents.validate_filename(file_name)
    content_type = body.get("content_type", "")
    if not isinstance(content_type, str) or len(content_type) > MAX_CONTENT_TYPE_CHARS:
        raise InvalidInput(
            f"content_type must be a string of at most {MAX_CONTENT_TYPE_CHARS} characters",
            code="invalid_content_type",
        )
    size = body.get("expected_size_bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise InvalidInput(
            "expected_size_bytes must be a whole number greater than 0", code="invalid_size"
        )
    limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
    if size > limit:
        raise PayloadTooLarge(
            upload_limit_message(limit), details={"limit_bytes": limit, "declared_bytes": size}
        )
    checksum = body.get("checksum_sha256")
    if not isinstance(checksum, str) or _decoded_digest(checksum) is None:
        raise InvalidInput(
            "checksum_sha256 must be the base64 of the file's 32-byte SHA-256 (44 characters)",
            code="invalid_checksum",
        )
    on_duplicate = body.get("on_duplicate", "reject")
    if on_duplicate not in documents.DUPLICATE_POLICIES:
        raise InvalidInput(
            f"on_duplicate must be one of {', '.join(documents.DUPLICATE_POLICIES)}",
            code="invalid_on_duplicate",
        )
    target = body.get("document_id")
    if target is not None:
        try:
            target = uuid.UUID(str(target))
        except ValueError:
            raise InvalidInput("document_id must be a UUID", code="invalid_document_id") from None
    return Declared(file_name, content_type, size, checksum, on_duplicate, target)


def _decoded_digest(checksum: str) -> bytes | None:
    if len(checksum) != 44:
        return None
    try:
        digest = base64.b64decode(checksum, validate=True)
    except (binascii.Error, ValueError):
        return None
    return digest if len(digest) == 32 else None


def object_key_for(space: KnowledgeSpace, session_id: uuid.UUID) -> str:
    """The session's object key: the key its document keeps (the session id is its id)."""
    return documents.storage_key_for(space, session_id)


def create_session(
    space: KnowledgeSpace, declared: Declared, *, idempotency_key: str = ""
) -> tuple[UploadSession, bool]:
    """Open a session (``ready``); returns ``(session, created)``.

    With an ``idempotency_key`` a second create in the same space returns the first session
    (``created`` False) when it declares the same file, else 409 ``idempotency_key_conflict``
    naming the field that differs; a replay of a session no longer ``ready`` is 409 too.
    A ``target_document_id`` must name a document of this space (404).
    """
    if idempotency_key and (
        len(idempotency_key) > 255
        or not idempotency_key.isascii()
        or not idempotency_key.isprintable()
    ):
        raise InvalidInput(
            "Idempotency-Key must be 1-255 printable ASCII characters",
            code="invalid_idempotency_key",
        )
    if declared.target_document_id is not None:
        Document.objects.get_in_space(space, declared.target_document_id, what="document")
    if idempotency_key:
        existing = UploadSession.objects.filter(space=space, idempotency_key=idempotency_key)
        replay = existing.first()
        if replay is not None:
            return _replayed(replay, declared), False
    session_id = uuid.uuid4()
    now = timezone.now()
    try:
        with transaction.atomic():
            _reserve(space, declared.expected_size_bytes)
            session = UploadSession.objects.create(
                id=session_id,
                tenant_id=space.tenant_id,
                space=space,
                status=UploadStatus.CREATING,
                mode=MODE,
                file_name=declared.file_name,
                content_type=declared.content_type,
                expected_size_bytes=declared.expected_size_bytes,
                checksum_sha256=declared.checksum_sha256,
                idempotency_key=idempotency_key or None,
                on_duplicate=declared.on_duplicate,
                target_document_id=declared.target_document_id,
                object_key=object_key_for(space, session_id),
                reserved_bytes=declared.expected_size_bytes,
                expires_at=now + timedelta(seconds=settings.KNOWLEDGE_UPLOAD_SESSION_TTL_SECONDS),
            )
            # Nothing to prepare remotely for small_fallback: ready at once.
            _move(session, UploadStatus.READY)
    except Exception:
        replay = UploadSession.objects.filter(space=space, idempotency_key=idempotency_key).first()
        if idempotency_key and replay is not None:  # a concurrent create with the same key won
            return _replayed(replay, declared), False
        raise
    return session, True


def _reserve(space: KnowledgeSpace, size: int) -> None:
    """Inside the create's transaction: refuse ``size`` more reserved bytes past the space's limit.

    The space row is locked first (``FOR NO KEY UPDATE`` on PostgreSQL; SQLite's IMMEDIATE
    transactions serialise writers), so two concurrent creates in one space read the total one
    after the other and cannot both pass it. A terminal session's zeroed reservation counts no
    more from its commit on. 409 ``upload_session_quota_exceeded`` names the limit.
    """
    lock_for_update(KnowledgeSpace.objects.filter(id=space.id)).values_list("id").first()
    limit = int(settings.KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE)
    held = reserved_bytes(space)
    if held + size > limit:
        raise Conflict(
            f"this space's open upload sessions reserve {held} bytes; {size} more would pass "
            f"KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE={limit}. Complete or abort "
            "open sessions, or wait for them to expire",
            code="upload_session_quota_exceeded",
            details={"limit_bytes": limit, "reserved_bytes": held, "requested_bytes": size},
        )


def _replayed(session: UploadSession, declared: Declared) -> UploadSession:
    for field, value in (
        ("file_name", declared.file_name),
        ("content_type", declared.content_type),
        ("expected_size_bytes", declared.expected_size_bytes),
        ("checksum_sha256", declared.checksum_sha256),
        ("on_duplicate", declared.on_duplicate),
        ("target_document_id", declared.target_document_id),
    ):
        if getattr(session, field) != value:
            raise Conflict(
                f"this Idempotency-Key already opened upload session {session.id} with another "
                f"{field}; use a new key for another file",
                code="idempotency_key_conflict",
                details={"field": field, "upload_session_id": str(session.id)},
            )
    if session.status not in (UploadStatus.READY, UploadStatus.COMPLETED):
        raise Conflict(
            f"this Idempotency-Key's upload session is {session.status}; open a new session",
            code="upload_session_state",
            details={"status": session.status},
        )
    return session


def get_session(space: KnowledgeSpace, session_id) -> UploadSession:
    """A session of ``space``, else 404 ``upload_session_not_found`` (also another space's)."""
    return UploadSession.objects.get_in_space(space, session_id, what="upload session")


def _move(session: UploadSession, status: str, **fields) -> bool:
    """Compare-and-set ``session`` to ``status`` from its ``row_version``; False if it moved."""
    if status in UPLOAD_TERMINAL:
        fields.setdefault("reserved_bytes", 0)
    updated = UploadSession.objects.filter(id=session.id, row_version=session.row_version).update(
        status=status, row_version=F("row_version") + 1, updated_at=timezone.now(), **fields
    )
    if updated:
        session.refresh_from_db()
    return bool(updated)


def _require_open(session: UploadSession) -> None:
    """409 unless the session is ``ready`` and not expired."""
    if session.status != UploadStatus.READY:
        raise Conflict(
            f"the upload session is {session.status}",
            code="upload_session_state",
            details={"status": session.status},
        )
    if session.expires_at <= timezone.now():
        raise Conflict(
            f"the upload session expired at {session.expires_at.isoformat()}; open a new one",
            code="upload_session_expired",
        )


def wants_bytes(session: UploadSession) -> bool:
    """Whether a small-file body is to be read: False when the session is already completing
    or completed (the write is then a no-op and completion replays); 409 unless open."""
    if session.status in (UploadStatus.COMPLETING, UploadStatus.COMPLETED):
        return False
    _require_open(session)
    return True


def store_bytes(session: UploadSession, data: bytes) -> None:
    """Check ``data`` against the declared size and checksum (422
    ``upload_integrity_mismatch``, nothing stored) and write it under the session's key."""
    if len(data) != session.expected_size_bytes:
        raise IntegrityMismatch(
            f"received {len(data)} bytes; the session declared {session.expected_size_bytes}",
            details={"received_bytes": len(data), "expected_bytes": session.expected_size_bytes},
        )
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    if digest != session.checksum_sha256:
        raise IntegrityMismatch(
            "the bytes' SHA-256 does not match checksum_sha256; nothing is stored",
            details={"field": "checksum_sha256"},
        )
    storage.put_object(session.object_key, data)


def complete(
    session: UploadSession, *, enqueue: bool = True, data: bytes | None = None
) -> UploadSession:
    """Admit the stored bytes as a document and bind its job; returns the completed session.

    Replays a completed session; resumes a ``completing`` one (after a crash); otherwise the
    session must be ready and unexpired (409). No object yet: 409 ``upload_not_received``. The
    object not matching size or checksum: ``failed``, object deleted, 422. A refused admission
    (duplicate, unsupported type...): ``failed``, object deleted, the admission's error.
    ``data``: the bytes the caller just wrote under the session's key (not read back).
    """
    if session.status == UploadStatus.COMPLETED:
        return session
    if session.status != UploadStatus.COMPLETING:
        _require_open(session)
    try:
        if data is None:  # else: the bytes just written (small-file), still in memory
            data = storage.read_object(session.object_key, max_bytes=session.expected_size_bytes)
    except FileNotFoundError:
        raise Conflict(
            "the upload session has no bytes yet; send them to its small-file route first",
            code="upload_not_received",
        ) from None
    except ValueError:
        data = None
    if session.status == UploadStatus.READY and not _move(session, UploadStatus.COMPLETING):
        session.refresh_from_db()
        return complete(session, enqueue=enqueue, data=data)
    if (
        data is None
        or len(data) != session.expected_size_bytes
        or (base64.b64encode(hashlib.sha256(data).digest()).decode() != session.checksum_sha256)
    ):
        _fail(session, IntegrityMismatch("the stored object does not match the declared file"))
    expected_version = session.row_version

    def bind(document: Document, job: CompilationJob) -> None:
        moved = UploadSession.objects.filter(
            id=session.id, row_version=expected_version, status=UploadStatus.COMPLETING
        ).update(
            status=UploadStatus.COMPLETED,
            row_version=F("row_version") + 1,
            reserved_bytes=0,
            document_id=document.id,
            job_id=job.id,
            completed_at=timezone.now(),
            updated_at=timezone.now(),
        )
        if not moved:
            raise Conflict("the upload session changed meanwhile", code="upload_session_state")

    stored = documents.StoredSource(document_id=session.id, key=session.object_key)
    try:
        if session.target_document_id is not None:
            # new content for an existing document: a candidate revision (ingestion.revisions)
            target = Document.objects.get_in_space(
                session.space, session.target_document_id, what="document"
            )
            documents.replace_document(
                target,
                filename=session.file_name,
                data=data,
                enqueue=enqueue,
                stored=stored,
                bind=bind,
            )
        else:
            documents.admit_document(
                session.space,
                filename=session.file_name,
                data=data,
                on_duplicate=session.on_duplicate,
                enqueue=enqueue,
                stored=stored,
                bind=bind,
            )
    except ServiceError as exc:
        session.refresh_from_db()
        if session.status == UploadStatus.COMPLETED:
            return session  # a concurrent completion won
        _fail(session, exc)
    except Exception:
        session.refresh_from_db()
        if session.status == UploadStatus.COMPLETED:
            return session
        raise  # a database or storage error: left completing, a retry resumes
    if not DocumentRevision.objects.filter(storage_key=session.object_key).exists():
        # The same bytes as an existing document: it compiles its own source object again.
        _discard(session.object_key, session.id)
    session.refresh_from_db()
    return session


def _fail(session: UploadSession, error: ServiceError) -> NoReturn:
    """Delete the object, then mark the session ``failed`` (quota released); raise ``error``."""
    _discard(session.object_key, session.id)
    _move(session, UploadStatus.FAILED, error_code=error.code, error_message=error.message)
    raise error


def _discard(key: str, session_id) -> None:
    try:
        storage.delete_object(key)
    except Exception as exc:  # noqa: BLE001 - the storage sweep reports what stays behind
        logger.warning(
            "could not delete the object of upload session %s: %s",
            session_id,
            getattr(exc, "code", type(exc).__name__),
        )


def abort(session: UploadSession) -> UploadSession:
    """Abort a ready session: ``aborting``, object deleted, ``aborted`` (quota released).

    Already aborted or expired: returned as it is. Completing or completed: 409. A failing
    delete leaves it ``aborting`` (the sweep finishes it) and raises the storage's error.
    """
    if session.status in (UploadStatus.ABORTED, UploadStatus.EXPIRED):
        return session
    if session.status not in (UploadStatus.READY, UploadStatus.CREATING):
        raise Conflict(
            f"an upload session that is {session.status} cannot be aborted",
            code="upload_session_state",
            details={"status": session.status},
        )
    if not _move(session, UploadStatus.ABORTING):
        session.refresh_from_db()
        return abort(session)
    storage.delete_object(session.object_key)
    _move(session, UploadStatus.ABORTED)
    return session


#: An ``aborting`` session untouched this long is finished by the sweep.
STALE_ABORTING = timedelta(minutes=5)


def sweep_expired(*, batch: int | None = None) -> dict[str, int]:
    """Expire ready/creating sessions past ``expires_at`` and finish stale ``aborting`` ones:
    each object deleted, then the row ``expired`` (or ``aborted``) with its quota released; at
    most ``batch`` (``KNOWLEDGE_UPLOAD_SESSION_SWEEP_BATCH``) per run. A failed delete leaves
    the row ``aborting`` for the next run. Returns counts."""
    batch = batch or settings.KNOWLEDGE_UPLOAD_SESSION_SWEEP_BATCH
    now = timezone.now()
    counts = {"expired": 0, "aborted": 0, "delete_failed": 0}
    due = list(
        UploadSession.objects.filter(
            status__in=[UploadStatus.CREATING, UploadStatus.READY], expires_at__lte=now
        ).order_by("expires_at")[:batch]
    )
    stale = list(
        UploadSession.objects.filter(
            status=UploadStatus.ABORTING, updated_at__lte=now - STALE_ABORTING
        ).order_by("updated_at")[: max(0, batch - len(due))]
    )
    for session in due + stale:
        was_aborting = session.status == UploadStatus.ABORTING
        if not was_aborting and not _move(session, UploadStatus.ABORTING):
            continue  # completed, aborted or claimed by another sweep meanwhile
        try:
            storage.delete_object(session.object_key)
        except Exception as exc:  # noqa: BLE001 - kept aborting; quota stays reserved
            counts["delete_failed"] += 1
            logger.warning(
                "upload session %s: object delete failed (%s); retried by the next sweep",
                session.id,
                getattr(exc, "code", type(exc).__name__),
            )
            continue
        final = UploadStatus.ABORTED if was_aborting else UploadStatus.EXPIRED
        if _move(session, final):
            counts["expired" if final == UploadStatus.EXPIRED else "aborted"] += 1
    return counts


def reserved_bytes(space: KnowledgeSpace) -> int:
    """Bytes the space's open sessions reserve (zero once every session ended)."""
    total = UploadSession.objects.filter(space=space, reserved_bytes__gt=0).aggregate(
        total=Sum("reserved_bytes")
    )
    return int(total["total"] or 0)
