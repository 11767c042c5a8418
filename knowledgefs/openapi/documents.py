"""Annotations of the document and job routes (``ingestion.api``) for the OpenAPI document
(:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers

from .common import (
    BOOLEAN,
    IDEMPOTENCY_KEY,
    INTEGER,
    REPLAYED,
    STRING,
    annotate,
    body,
    error,
    etag,
    if_match,
    page,
    page_parameters,
    shape,
)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    from ingestion.api.serializers import DocumentSerializer, JobSerializer

    admitted = inline_serializer(
        name="DocumentAdmission",
        fields={
            "document": DocumentSerializer(),
            "job": JobSerializer(),
            "created": serializers.BooleanField(
                help_text="false when `on_duplicate=replace` replaced an earlier document."
            ),
        },
    )
    annotate(
        "ingestion.api.views.DocumentListView",
        get=extend_schema(
            summary="List the space's documents, newest first",
            parameters=page_parameters(20),
            responses={200: page("DocumentPage", DocumentSerializer)},
        ),
        post=extend_schema(
            summary="Upload one file",
            request={
                "multipart/form-data": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            parameters=[
                IDEMPOTENCY_KEY,
                REPLAYED,
                OpenApiParameter(
                    "on_duplicate",
                    str,
                    OpenApiParameter.QUERY,
                    enum=["reject", "replace"],
                    description="Same bytes already in the space: 409 `duplicate_document` "
                    "(`reject`, the default) or a new version (`replace`).",
                ),
            ],
            responses={
                202: admitted,
                408: error("`upload_timeout`: the body stopped arriving."),
                409: error(
                    "`duplicate_document`, `space_setup_required`, `space_pending_validation`, "
                    "`space_validation_failed`, `concurrent_change`, "
                    "`idempotency_key_in_progress`."
                ),
                411: error("`length_required`: no `Content-Length`."),
                413: error("`file_too_large`, `upload_reservation_too_large`."),
                415: error("`unsupported_media_type`, `content_mismatch`."),
                422: error("`idempotency_key_reused`."),
                429: error("`upload_admission_busy` (`Retry-After`), `rate_limited`."),
                503: error("`storage_unavailable`: Dify's object storage failed; nothing stored."),
            },
        ),
    )
    annotate(
        "ingestion.api.views.DocumentDetailView",
        get=extend_schema(
            summary="Read a document",
            parameters=[etag("document's `row_version`")],
            responses={200: DocumentSerializer},
        ),
        patch=extend_schema(
            summary="Enable, disable or annotate a document",
            parameters=[
                if_match("document's `row_version`", "document_version_conflict"),
                etag("document's new `row_version`"),
            ],
            request=body(
                "`metadata` merges (a `null` value removes the key); the expected version comes "
                "from `If-Match` or `row_version`.",
                {
                    "enabled": BOOLEAN,
                    "metadata": {"type": "object", "additionalProperties": True},
                    "row_version": {"type": "integer", "minimum": 1},
                },
            ),
            responses={
                200: DocumentSerializer,
                409: error("`document_version_conflict` (`details.expected`, `current`)."),
            },
        ),
        delete=extend_schema(
            summary="Delete a document",
            responses={
                204: OpenApiResponse(description="Deleted."),
                503: error("`storage_unavailable`: the document is kept; send it again."),
            },
        ),
    )
    annotate(
        "ingestion.api.views.DocumentTextView",
        get=extend_schema(
            summary="The document's published canonical text",
            parameters=[
                OpenApiParameter(
                    "start", OpenApiTypes.INT, OpenApiParameter.QUERY, description="Code point."
                ),
                OpenApiParameter(
                    "end", OpenApiTypes.INT, OpenApiParameter.QUERY, description="Code point."
                ),
            ],
            responses={
                200: shape(
                    "The text between `start` and `end` (code-point offsets, as in citations).",
                    {"document_id": STRING, "text": STRING, "start": INTEGER, "end": INTEGER},
                ),
                409: error("`document_disabled`, or no published text yet."),
            },
        ),
    )
    annotate(
        "ingestion.api.views.DocumentAssetView",
        get=extend_schema(
            summary="One stored image of the published document",
            parameters=[
                OpenApiParameter(
                    "variant",
                    str,
                    OpenApiParameter.QUERY,
                    description="`thumbnail` (a PDF page image's thumbnail); 400 `invalid_variant`"
                    ", 404 `asset_variant_not_found`.",
                ),
            ],
            responses={
                (200, "application/octet-stream"): OpenApiResponse(
                    OpenApiTypes.BINARY,
                    description="The bytes: inline for PNG/JPEG/GIF/WebP, else an attachment; "
                    "always `X-Content-Type-Options: nosniff` and "
                    "`Content-Security-Policy: default-src 'none'; sandbox`.",
                ),
                404: error("`asset_not_found`, `asset_variant_not_found`, `document_not_found`."),
                409: error("`document_disabled`, `document_not_published`."),
                413: error("`asset_too_large`: over `KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES`."),
            },
        ),
    )
    annotate(
        "ingestion.api.views.JobListView",
        get=extend_schema(
            summary="The space's compilation attempts, newest first",
            parameters=[
                *page_parameters(20),
                OpenApiParameter(
                    "state",
                    str,
                    OpenApiParameter.QUERY,
                    description="Only jobs in this public state (400 `invalid_state`).",
                ),
            ],
            responses={200: page("JobPage", JobSerializer)},
        ),
    )
    annotate(
        "ingestion.api.views.JobDetailView",
        get=extend_schema(summary="Read a compilation attempt", responses={200: JobSerializer}),
        delete=extend_schema(
            summary="Cancel a live attempt",
            responses={200: JobSerializer, 409: error("`job_finished`.")},
        ),
    )
    annotate(
        "ingestion.api.views.JobRetryView",
        post=extend_schema(
            summary="Retry a failed or canceled attempt",
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            request=body(
                "Where the new attempt starts.",
                {"from": {"type": "string", "enum": ["checkpoint", "start"]}},
            ),
            responses={
                202: JobSerializer,
                409: error("`job_live`, `job_succeeded`, `job_superseded`."),
                422: error("`idempotency_key_reused`."),
            },
        ),
    )
    _upload_sessions()


def _upload_sessions() -> None:
    """Upload sessions (``ingestion.api.upload_sessions``) and document revisions."""
    session = shape(
        '`{"session": {id, space_id, mode, status, file_name, content_type, '
        "expected_size_bytes, on_duplicate, target_document_id, expires_at, completed_at, "
        "document_id, compilation_job_id, error_code, error_message, created_at}}`.",
        {"session": {"type": "object", "additionalProperties": True}},
    )
    states = "`upload_session_state`, `upload_session_expired`"
    annotate(
        "ingestion.api.upload_sessions.UploadSessionListView",
        post=extend_schema(
            summary="Open an upload session",
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            request=body(
                "The file the session will receive.",
                {
                    "file_name": {"type": "string", "maxLength": 512},
                    "content_type": {"type": "string", "maxLength": 255},
                    "expected_size_bytes": {"type": "integer", "minimum": 1},
                    "checksum_sha256": {"type": "string", "minLength": 44, "maxLength": 44},
                    "on_duplicate": {"type": "string", "enum": ["reject", "replace"]},
                    "document_id": {"type": "string", "format": "uuid"},
                },
                ("file_name", "expected_size_bytes", "checksum_sha256"),
            ),
            responses={
                200: session,
                201: session,
                409: error("`idempotency_key_conflict`, `upload_session_state`."),
                413: error("`file_too_large`: over `KNOWLEDGE_UPLOAD_MAX_BYTES`."),
            },
        ),
    )
    annotate(
        "ingestion.api.upload_sessions.UploadSessionDetailView",
        get=extend_schema(summary="Read an upload session", responses={200: session}),
    )
    annotate(
        "ingestion.api.upload_sessions.UploadSessionSmallFileView",
        post=extend_schema(
            summary="Send the session's bytes (small-file fallback) and complete it",
            request={"application/octet-stream": {"type": "string", "format": "binary"}},
            responses={
                200: session,
                400: error("`upload_incomplete`, `invalid_content_length`."),
                408: error("`upload_timeout`: the body stopped arriving."),
                409: error(f"{states}, `duplicate_document`."),
                411: error("`length_required`: no `Content-Length`."),
                413: error("`upload_size_mismatch`, `upload_reservation_too_large`."),
                415: error("`unsupported_media_type`, `content_mismatch`."),
                422: error("`upload_integrity_mismatch`: size or SHA-256; nothing stored."),
                429: error("`upload_admission_busy` (`Retry-After`), `rate_limited`."),
            },
        ),
    )
    annotate(
        "ingestion.api.upload_sessions.UploadSessionCompleteView",
        post=extend_schema(
            summary="Complete an upload session (replayable)",
            request=None,
            responses={
                200: session,
                409: error(f"`upload_not_received`, {states}, `duplicate_document`."),
                422: error("`upload_integrity_mismatch`: the stored object does not match."),
            },
        ),
    )
    annotate(
        "ingestion.api.upload_sessions.UploadSessionAbortView",
        post=extend_schema(
            summary="Abort an upload session",
            request=None,
            responses={200: session, 409: error(states)},
        ),
    )
    annotate(
        "ingestion.api.views.DocumentRevisionListView",
        get=extend_schema(
            summary="The document's revisions, newest first",
            responses={
                200: shape(
                    "`{document_id, active_revision_id, results: [{id, number, state "
                    "(active|candidate|superseded|failed|canceled), filename, mime_type, "
                    "size_bytes, sha256, job_id, error_code, error_message, created_at, "
                    "published_at}]}`.",
                    {"results": {"type": "array", "items": {"type": "object"}}},
                )
            },
        ),
    )
