"""Query images through Dify's inner API: a Dify ``UploadFile`` read for one query run.

``GET /inner/api/knowledge-fs/query-image?uploadFileId=&tenantId=&subjectId=``: Dify checks that
the file belongs to the tenant (and to the acting subject), streams its bytes with its stored
``Content-Type`` and adds ``X-Query-Image-Sha256``; 404 for a file that is not the caller's. The
body is read as a bounded stream that stops past ``max_bytes`` (``QUERY_IMAGE_TOO_LARGE``) under
one deadline (``QUERY_IMAGE_TIMEOUT``: a stalled stream ends there). Nothing is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DifyError
from .transport import DifyTransport

QUERY_IMAGE = "/inner/api/knowledge-fs/query-image"
SHA256_HEADER = "X-Query-Image-Sha256"


class QueryImageError(DifyError):
    """Reading a query image from Dify failed."""

    CODES = {
        "timeout": "QUERY_IMAGE_TIMEOUT",
        "unavailable": "QUERY_IMAGE_UNAVAILABLE",
        "rejected": "QUERY_IMAGE_REQUEST_REJECTED",
        "too_large": "QUERY_IMAGE_TOO_LARGE",
        "invalid": "QUERY_IMAGE_RESPONSE_INVALID",
        "not_found": "QUERY_IMAGE_NOT_FOUND",
        "input": "QUERY_IMAGE_INPUT_INVALID",
        "error": "QUERY_IMAGE_ERROR",
    }


@dataclass(frozen=True)
class FetchedImage:
    data: bytes
    content_type: str
    sha256: str


def fetch_query_image(
    *,
    tenant_id: str,
    upload_file_id: str,
    subject_id: str,
    max_bytes: int,
    timeout: float,
    transport: DifyTransport | None = None,
) -> FetchedImage | None:
    """The file's bytes, its stored type and Dify's SHA-256; ``None`` when Dify answers 404 (not
    the caller's file, or gone). Raises :class:`QueryImageError`."""
    transport = transport or DifyTransport()
    params = {"uploadFileId": upload_file_id, "tenantId": tenant_id, "subjectId": subject_id}
    stream = transport.open_stream(
        "GET",
        QUERY_IMAGE,
        errors=QueryImageError,
        timeout=timeout,
        max_bytes=max_bytes,
        retry_until_body=True,
        params=params,
        passthrough=(404,),
    )
    with stream:
        if stream.status == 404:
            return None
        data = stream.read_all()
        content_type = (stream.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        return FetchedImage(data, content_type, stream.headers.get(SHA256_HEADER) or "")
