"""REST views for documents and compilation jobs: thin wrappers over the ingestion services."""

from __future__ import annotations

import hashlib

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from ingestion import availability, documents, reports, revisions
from ingestion.compilation import operations
from ingestion.upload_admission import BufferedUploadAdmissionMixin
from knowledgefs.auth.operations import WRITE_CALLERS, Operation, child, space_from
from knowledgefs.errors import InvalidInput
from knowledgefs.idempotency import fingerprint, idempotent
from knowledgefs.pagination import NewestFirstPagination
from knowledgefs.uploads import require_multipart
from retrieval.backends import require_supported_engine
from spaces.services import get_space

from .serializers import DocumentSerializer, JobSerializer


class DocumentListView(BufferedUploadAdmissionMixin, APIView):
    operations = {
        "GET": Operation("documents.list", space_from()),
        "POST": Operation("documents.create", space_from(), WRITE_CALLERS),
    }

    def get(self, request, space_id):
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(documents.documents_in(space), request, view=self)
        return paginator.get_paginated_response(DocumentSerializer(page, many=True).data)

    def post(self, request, space_id):
        """Upload one file (multipart field ``file``); 202 with the document and its job.

        The body is read only after the upload admission (ingestion.upload_admission: 411, 413,
        429, 408 before or while it is read).
        """
        space = get_space(request.user, space_id)
        require_supported_engine()  # 503 on MySQL/MariaDB before anything is written
        require_multipart(request.content_type)
        uploads = request.FILES.getlist("file")
        if len(uploads) > 1:
            raise InvalidInput(
                "send one file per request in the field 'file'", code="too_many_files"
            )
        if not uploads:
            if hasattr(request.data, "get") and "file" in request.data:
                raise InvalidInput("the 'file' part has no filename", code="invalid_filename")
            raise InvalidInput("multipart field 'file' is required", code="file_required")
        upload = uploads[0]
        on_duplicate = request.query_params.get("on_duplicate", "reject")
        filename = getattr(upload, "raw_name", upload.name)
        data = upload.read()

        def admit() -> Response:
            admission = documents.admit_document(
                space, filename=filename, data=data, on_duplicate=on_duplicate
            )
            return Response(
                {
                    "document": DocumentSerializer(admission.document).data,
                    "job": JobSerializer(admission.job).data,
                    "created": admission.created,
                },
                status=status.HTTP_202_ACCEPTED,
            )

        request_fingerprint = fingerprint(
            "documents.upload",
            str(space.id),
            filename,
            on_duplicate,
            hashlib.sha256(data).hexdigest(),
        )
        return idempotent(request, request_fingerprint, admit)


class DocumentDetailView(APIView):
    operations = {
        "GET": Operation("documents.read", child("document", "document_id")),
        "PATCH": Operation("documents.update", child("document", "document_id"), WRITE_CALLERS),
        "DELETE": Operation("documents.delete", child("document", "document_id"), WRITE_CALLERS),
    }

    def get(self, request, space_id, document_id):
        from ingestion.enrichment import published_report

        document = documents.get_document(request.user, space_id, document_id)
        body = {
            **DocumentSerializer(document).data,
            "image_understanding": published_report(document),
        }
        return Response(body, headers=_etag(document))

    def patch(self, request, space_id, document_id):
        """Body ``{"enabled"?: bool, "metadata"?: object}`` (metadata merges; ``null`` removes a
        key). The expected ``row_version`` comes from ``If-Match`` (e.g. ``"3"``) or the body's
        ``row_version``; 200 with the document and its new ``ETag``; 409
        ``document_version_conflict`` when it moved on (see ingestion.availability)."""
        body = request.data if hasattr(request.data, "get") else None
        if body is None:
            raise InvalidInput("the body must be a JSON object", code="invalid_request")
        document = availability.update_document(
            request.user,
            space_id,
            document_id,
            expected_row_version=_expected_version(request, body),
            enabled=body.get("enabled"),
            metadata=body.get("metadata"),
        )
        return Response(DocumentSerializer(document).data, headers=_etag(document))

    def delete(self, request, space_id, document_id):
        documents.delete_document(request.user, space_id, document_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _etag(document) -> dict:
    return {"ETag": f'"{document.row_version}"'}


def _expected_version(request, body):
    """``If-Match: "N"`` (or ``N``) wins over the body's ``row_version``; a missing or malformed
    one is left to the service, which answers 400 ``invalid_row_version``."""
    header = request.headers.get("If-Match", "").strip()
    if header:
        raw = header.removeprefix("W/").strip('"')
        return int(raw) if raw.isascii() and raw.isdigit() else None
    return body.get("row_version")


class DocumentAssetView(APIView):
    operations = {"GET": Operation("documents.read_asset", child("document", "document_id"))}

    def get(self, request, space_id, document_id, asset_id):
        """One stored image of the published document (``?variant=thumbnail``), served inline
        only for PNG/JPEG/GIF/WebP, else as an attachment; 413 before reading when too large."""
        from django.http import HttpResponse

        from ingestion.assets_read import read_asset

        body = read_asset(
            request.user,
            space_id,
            document_id,
            asset_id,
            variant=request.query_params.get("variant"),
        )
        response = HttpResponse(body.data, content_type=body.content_type)
        disposition = "inline" if body.inline else "attachment"
        response["Content-Disposition"] = f'{disposition}; filename="{body.filename}"'
        response["Content-Length"] = str(len(body.data))
        response["Cache-Control"] = "private, max-age=300"
        if body.sha256:
            response["ETag"] = f'"{body.sha256}"'
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response


class DocumentTextView(APIView):
    operations = {"GET": Operation("documents.read_text", child("document", "document_id"))}

    def get(self, request, space_id, document_id):
        """The published canonical text (``?start=&end=`` code-point offsets, as in citations)."""
        try:
            start = int(request.query_params.get("start", 0))
            end = request.query_params.get("end")
            end = int(end) if end is not None else None
        except ValueError:
            raise InvalidInput("start and end must be integers", code="invalid_range") from None
        return Response(
            documents.published_text(request.user, space_id, document_id, start=start, end=end)
        )


class DocumentRevisionListView(APIView):
    operations = {
        "GET": Operation("document_revisions.list", child("document", "document_id")),
    }

    def get(self, request, space_id, document_id):
        """The document's revisions, newest first, with their derived state (``active``,
        ``candidate``, ``superseded``, ``failed``, ``canceled``) and a failed one's error."""
        document = documents.get_document(request.user, space_id, document_id)
        return Response(
            {
                "document_id": str(document.id),
                "active_revision_id": str(document.active_revision_id)
                if document.active_revision_id
                else None,
                "results": revisions.revisions_of(document),
            }
        )


class JobListView(APIView):
    operations = {"GET": Operation("jobs.list", space_from())}

    def get(self, request, space_id):
        """The space's compilation attempts, newest first; ``?state=`` filters by public state."""
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        jobs = reports.jobs_in(space, state=request.query_params.get("state") or None)
        page = paginator.paginate_queryset(jobs, request, view=self)
        return paginator.get_paginated_response(JobSerializer(page, many=True).data)


class JobDetailView(APIView):
    # /v1/jobs/{job_id} does not name the space: the token's parent_id scopes the lookup.
    operations = {
        "GET": Operation("jobs.read", child("job", "job_id", parent_field=None)),
        "DELETE": Operation(
            "jobs.cancel", child("job", "job_id", parent_field=None), WRITE_CALLERS
        ),
    }

    def get(self, request, job_id):
        """Stage, run state, progress and error of one compilation attempt."""
        return Response(JobSerializer(documents.get_job(request.user, job_id)).data)

    def delete(self, request, job_id):
        """Cancel a live attempt (409 ``job_finished`` once it ended); 200 with the job."""
        job = documents.get_job(request.user, job_id)
        return Response(JobSerializer(operations.cancel_job(job.id)).data)


class JobRetryView(APIView):
    operations = {
        "POST": Operation("jobs.retry", child("job", "job_id", parent_field=None), WRITE_CALLERS)
    }

    def post(self, request, job_id):
        """Start a new attempt of a failed or canceled job from its last good checkpoint.

        Body (optional): ``{"from": "checkpoint" | "start"}``. 202 with the new attempt.
        """
        job = documents.get_job(request.user, job_id)
        start = request.data.get("from", "checkpoint") if hasattr(request.data, "get") else None
        if start not in ("checkpoint", "start"):
            raise InvalidInput("'from' must be 'checkpoint' or 'start'", code="invalid_retry_start")

        def retry() -> Response:
            attempt = operations.retry_job(job.id, from_checkpoint=start == "checkpoint")
            return Response(JobSerializer(attempt).data, status=status.HTTP_202_ACCEPTED)

        return idempotent(request, fingerprint("jobs.retry", str(job.id), start), retry)
