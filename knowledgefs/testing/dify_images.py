"""Images in the simulated Dify: the multimodal embedding route's limits and its image embedder.

The embedder makes visual retrieval checkable: an image is decoded with Pillow, reduced to an
8×8 grey thumbnail, centred and L2-normalised, and spread over the model's dimension with fixed
signed buckets. The same picture (also re-encoded, e.g. PNG → JPEG, or scaled) gets the same or
a very near vector, different pictures get far ones, so "the query image of a figure finds the
page of that figure" can be asserted. A text document on the route is embedded as the text
route does (one model, one space). Bytes that are not an image are a 400, as Dify refuses them.

``GET /inner/api/knowledge-fs/query-image`` (:func:`serve_query_image`) serves the
server's ``query_images`` — ``{(tenant_id, upload_file_id): (bytes, stored MIME type,
owner subject or None)}`` — with ``X-Query-Image-Sha256``; any other file, another tenant's or
another subject's, is 404. Faults (stall, drop, delay, status) apply to it like every route.

Limits, as Dify's route enforces them: at most :data:`MAX_DOCUMENTS` documents and
:data:`MAX_BATCH_BYTES` raw bytes per request, :data:`MAX_DOCUMENT_BYTES` per document (413
``multimodal_request_too_large``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
from typing import Any

MAX_DOCUMENTS = 8
MAX_BATCH_BYTES = 32 * 1024 * 1024
MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
THUMBNAIL = 8
QUERY_IMAGE = "/inner/api/knowledge-fs/query-image"


class ImageRefusal(Exception):
    """The route's refusal: HTTP ``status``, ``code``, ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bucket(index: int, dimension: int) -> tuple[int, float]:
    digest = hashlib.sha256(f"kfs-image:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % dimension, 1.0 if digest[4] & 1 else -1.0


def image_vector(data: bytes, dimension: int) -> list[float]:
    """The embedding of one image (see the module docstring); ImageRefusal 400 when ``data`` is
    not an image Pillow can decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("L", (THUMBNAIL * 4, THUMBNAIL * 4))
            grey = image.convert("L").resize((THUMBNAIL, THUMBNAIL), Image.Resampling.BOX)
            pixels = [float(v) for v in grey.tobytes()]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        message = f"a document is not a readable image: {exc}"
        raise ImageRefusal(400, "invalid_image", message) from None
    mean = sum(pixels) / len(pixels)
    centred = [p - mean for p in pixels]
    vector = [0.0] * dimension
    if dimension == len(centred):
        vector = centred
    else:
        for index, value in enumerate(centred):
            bucket, sign = _bucket(index, dimension)
            vector[bucket] += sign * value
    # A flat picture (one colour) has no shape: its brightness decides, far from other pictures.
    vector[0] += mean / 255.0 + 1e-3
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def decode_documents(documents: object) -> list[tuple[str, bytes]]:
    """``[(content_type, raw bytes)]`` of a request's ``documents``, within the limits."""
    if not isinstance(documents, list) or not documents:
        raise ImageRefusal(400, "invalid_request", "documents must be a non-empty list")
    if len(documents) > MAX_DOCUMENTS:
        raise ImageRefusal(
            413,
            "multimodal_request_too_large",
            f"{len(documents)} documents in one request; at most {MAX_DOCUMENTS}",
        )
    decoded, total = [], 0
    for document in documents:
        if not isinstance(document, dict) or not isinstance(document.get("content"), str):
            raise ImageRefusal(400, "invalid_request", "a document has no content")
        try:
            raw = base64.b64decode(document["content"], validate=True)
        except (binascii.Error, ValueError):
            message = "a document's content is not base64"
            raise ImageRefusal(400, "invalid_request", message) from None
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise ImageRefusal(
                413,
                "multimodal_request_too_large",
                f"a document of {len(raw)} bytes; at most {MAX_DOCUMENT_BYTES}",
            )
        total += len(raw)
        if total > MAX_BATCH_BYTES:
            raise ImageRefusal(
                413,
                "multimodal_request_too_large",
                f"more than {MAX_BATCH_BYTES} raw bytes in one request",
            )
        decoded.append((str(document.get("content_type") or "image"), raw))
    return decoded


def serve_query_image(handler: Any, query: dict[str, str]) -> None:
    """The query-image route of the simulated Dify (see the module docstring)."""
    key = (query.get("tenantId", ""), query.get("uploadFileId", ""))
    found = handler.dify.query_images.get(key)
    if found is None or (found[2] is not None and found[2] != query.get("subjectId")):
        handler._json(404, {"code": "query_image_not_found", "message": "not found"})
        return
    data, mime_type, _owner = found
    handler._start(
        200,
        {
            "Content-Type": mime_type,
            "Content-Length": str(len(data)),
            "X-Query-Image-Sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    handler._write(data)
