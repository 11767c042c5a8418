"""REST views of upload sessions: thin wrappers over ingestion.upload_sessions.

Each route is one registered operation (``upload_sessions.create/read/write/complete/abort``);
the small-file body is read only after the small-fallback admission
(ingestion.fallback_admission).
"""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from ingestion import fallback_admission, upload_sessions
from ingestion.models import UploadSession
from knowledgefs.auth.operations import WRITE_CALLERS, Operation, child, space_from
from knowledgefs.idempotency import HEADER
from retrieval.backends import require_supported_engine
from spaces.services import get_space


def session_body(session: UploadSession) -> dict:
    """The public session: never its checksum, object key or idempotency key."""
    return {
        "id": str(session.id),
        "space_id": str(session.space_id),
        "mode": session.mode,
        "status": session.status,
        "file_name": session.file_name,
        "content_type": session.content_type,
        "expected_size_bytes": session.expected_size_bytes,
        "on_duplicate": session.on_duplicate,
        "target_document_id": _text(session.target_document_id),
        "expires_at": session.expires_at.isoformat(),
        "completed_at": session.completed_at.isoformat() if session.completed_at else None,
        "document_id": _text(session.document_id),
        "compilation_job_id": _text(session.job_id),
        "error_code": session.error_code or None,
        "error_message": session.error_message or None,
        "created_at": session.created_at.isoformat(),
    }


def _text(value) -> str | None:
    return None if value is None else str(value)


def _session_of(request, space_id, session_id) -> UploadSession:
    return upload_sessions.get_session(get_space(request.user, space_id), session_id)


class UploadSessionListView(APIView):
    operations = {
        "POST": Operation("upload_sessions.create", space_from(), WRITE_CALLERS),
    }

    def post(self, request, space_id):
        """Open a session: ``{file_name, content_type, expected_size_bytes, checksum_sha256,
        on_duplicate?, document_id?}``; 201 ``{session}`` (200 with ``Idempotent-Replayed``
        for a replay of the same ``Idempotency-Key``)."""
        space = get_space(request.user, space_id)
        require_supported_engine()
        body = request.data if hasattr(request.data, "get") else None
        declared = upload_sessions.parse_declaration(body)
        session, created = upload_sessions.create_session(
            space, declared, idempotency_key=request.META.get(HEADER) or ""
        )
        response = Response(
            {"session": session_body(session)},
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )
        if not created:
            response["Idempotent-Replayed"] = "true"
        return response


class UploadSessionDetailView(APIView):
    operations = {
        "GET": Operation("upload_sessions.read", child("upload_session", "session_id")),
    }

    def get(self, request, space_id, session_id):
        return Response({"session": session_body(_session_of(request, space_id, session_id))})


class UploadSessionSmallFileView(APIView):
    operations = {
        "POST": Operation(
            "upload_sessions.write", child("upload_session", "session_id"), WRITE_CALLERS
        ),
    }

    def post(self, request, space_id, session_id):
        """The raw bytes (``application/octet-stream``, exactly ``expected_size_bytes``); the
        session completes in the same request: 200 ``{session}``."""
        session = _session_of(request, space_id, session_id)
        require_supported_engine()
        if not upload_sessions.wants_bytes(session):  # completing or completed: replay
            return Response({"session": session_body(upload_sessions.complete(session))})
        # The gate's place is held through the write and the inline completion, so the buffers
        # of admitted bodies are all this path holds at once.
        with fallback_admission.admitted_body(
            request._request, session.expected_size_bytes
        ) as buffer:
            data = bytes(buffer)
            upload_sessions.store_bytes(session, data)
            del buffer[:]  # the copy is what the admission reads
            session = upload_sessions.complete(session, data=data)
        return Response({"session": session_body(session)})


class UploadSessionCompleteView(APIView):
    operations = {
        "POST": Operation(
            "upload_sessions.complete", child("upload_session", "session_id"), WRITE_CALLERS
        ),
    }

    def post(self, request, space_id, session_id):
        """Admit the stored bytes as a document (replayable); 200 ``{session}``."""
        session = _session_of(request, space_id, session_id)
        require_supported_engine()
        return Response({"session": session_body(upload_sessions.complete(session))})


class UploadSessionAbortView(APIView):
    operations = {
        "POST": Operation(
            "upload_sessions.abort", child("upload_session", "session_id"), WRITE_CALLERS
        ),
    }

    def post(self, request, space_id, session_id):
        """Abort a ready session (its object deleted); 200 ``{session}``."""
        session = _session_of(request, space_id, session_id)
        return Response({"session": session_body(upload_sessions.abort(session))})
