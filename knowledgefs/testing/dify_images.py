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

Image understanding: an LLM request carrying an image whose prompt asks for ``{caption,
ocr_text, summary}`` is answered that JSON by :func:`describe_request`: the description a test
registered for the nearest picture (``image_captions``, by the embedder's vector), else one derived
from the picture (its size and main colour), so the same image always gets the same text.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dify_server import DifyTestServer

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


DESCRIPTION_MEMBERS = ('"caption"', '"ocr_text"', '"summary"')
_COLOURS = {
    "black": (0, 0, 0), "white": (255, 255, 255), "red": (200, 30, 30), "green": (30, 160, 60),
    "blue": (30, 60, 200), "yellow": (230, 210, 40), "grey": (128, 128, 128),
    "orange": (240, 140, 20), "purple": (130, 50, 160),
}  # fmt: skip


def describe_request(body: dict[str, Any], dify: DifyTestServer) -> str | None:
    """The JSON answer of an image-description request (module docstring), ``None`` for any
    other LLM request."""
    import json

    parts = [
        part
        for message in body.get("prompt_messages") or []
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict)
    ]
    prompt = " ".join(str(p.get("data") or "") for p in parts if p.get("type") == "text")
    images = [p for p in parts if p.get("type") == "image"]
    if not images or not all(member in prompt for member in DESCRIPTION_MEMBERS):
        return None
    data = base64.b64decode(images[0].get("base64_data") or "")
    with dify.lock:
        dify.image_descriptions += 1
    return json.dumps(describe_image(data, dify.image_captions))


def describe_image(data: bytes, known: list[tuple[bytes, dict[str, Any]]]) -> dict[str, Any]:
    """``{caption, ocr_text, summary}`` of one picture: a registered description of the nearest
    registered picture (cosine of the embedder's vectors at least 0.5), else one from its size
    and main colour."""
    from PIL import Image

    try:
        vector = image_vector(data, 64)
    except ImageRefusal:
        return {"caption": "An unreadable image", "ocr_text": "", "summary": ""}
    best, score = None, 0.5
    for picture, description in known:
        other = image_vector(picture, 64)
        cosine = sum(a * b for a, b in zip(vector, other, strict=True))
        if cosine >= score:
            best, score = description, cosine
    if best is not None:
        return dict(best)
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        pixel = image.convert("RGB").resize((1, 1), Image.Resampling.BOX).getpixel((0, 0))
    # An RGB image's pixel is an (r, g, b) tuple; Pillow types getpixel for every mode.
    if not isinstance(pixel, tuple) or len(pixel) != 3:
        raise ValueError(f"an RGB pixel is not (r, g, b): {pixel!r}")
    red, green, blue = pixel
    colour = min(
        _COLOURS,
        key=lambda n: sum(
            (a - b) ** 2 for a, b in zip(_COLOURS[n], (red, green, blue), strict=True)
        ),
    )
    return {
        "caption": f"A picture of {width} by {height} pixels, mostly {colour}",
        "ocr_text": "",
        "summary": f"An image {width} pixels wide and {height} high, on average {colour}.",
    }
