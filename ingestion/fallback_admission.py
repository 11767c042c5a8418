"""Small-file fallback admission: the process-wide gate of upload-session bodies.

Under the Dify storage bridge (no presigned or multipart primitives) and the embedded default,
an upload session's bytes are POSTed to this API (``…/upload-sessions/{id}/small-file``), which
buffers them whole and writes them through the object storage. That path has its own gate,
separate from the multipart one (ingestion.upload_admission), per the seed deployment guide:

* at most ``KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY`` (2, 1..8) admitted bodies;
* at most ``KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES`` (30 MiB, at least the
  per-file limit, at most 100 MiB) reserved, each body reserving its declared size once (the
  buffer is exactly that size);
* the place is taken before the buffer is allocated and held until the object write finished;
  waiting is FIFO for at most the idle timeout, then 429 ``upload_admission_busy`` (a request
  that gives up never allocated its buffer);
* the body is read under the same idle and total deadlines as a multipart upload (408
  ``upload_timeout``; a body that ends early is 400 ``upload_incomplete``), and the place is
  released on every outcome.

:func:`diagnostics` feeds ``/health`` (``small_fallback_uploads``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings

from ingestion.upload_admission import AdmissionGate, DeadlineStream
from knowledgefs.errors import InvalidInput, LengthRequired, PayloadTooLarge

#: The process-wide gate of small-file fallback bodies (one per API process).
GATE = AdmissionGate(
    concurrency_setting="KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY",
    reserved_setting="KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES",
    factor=1,
)
#: Bytes asked of the body stream per read.
READ_CHUNK = 64 * 1024


def check_length(request: Any, expected: int) -> None:
    """Check the declared Content-Length against the session's size before anything is read.

    Missing or chunked: 411 ``length_required``; not a number: 400 ``invalid_content_length``;
    larger: 413 ``upload_size_mismatch`` (the body is never read); smaller: 400
    ``upload_incomplete``.
    """
    raw = (request.META.get("CONTENT_LENGTH") or "").strip()
    if not raw:
        raise LengthRequired(
            "the small-file body needs a Content-Length header equal to expected_size_bytes "
            "(chunked request bodies are not accepted)"
        )
    if not (raw.isascii() and raw.isdigit()):
        raise InvalidInput(
            f"Content-Length {raw[:40]!r} is not a number", code="invalid_content_length"
        )
    declared = int(raw)
    if declared > expected:
        GATE.count("refused_declared_too_large")
        raise PayloadTooLarge(
            f"the body declares {declared} bytes but the session expects exactly {expected} "
            "(expected_size_bytes); nothing was read or stored",
            code="upload_size_mismatch",
            details={"declared_bytes": declared, "expected_bytes": expected},
        )
    if declared < expected:
        raise InvalidInput(
            f"the body declares {declared} bytes but the session expects exactly {expected} "
            "(expected_size_bytes); nothing was read or stored",
            code="upload_incomplete",
            details={"declared_bytes": declared, "expected_bytes": expected},
        )


@contextmanager
def admitted_body(request: Any, expected: int) -> Iterator[bytearray]:
    """Admit and read exactly ``expected`` body bytes of ``request`` (Django's), yielding the
    buffer; the gate's place is held until the ``with`` block ends (the object write).

    Raises before anything is read: 411/400/413 (:func:`check_length`), 413
    ``upload_reservation_too_large``, 429 ``upload_admission_busy``; while reading: 408
    ``upload_timeout``, 400 ``upload_incomplete``.
    """
    check_length(request, expected)
    wait = settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS / 1000
    lease = GATE.acquire(expected, wait_seconds=wait)
    try:
        stream = DeadlineStream(
            request._stream,
            expected,
            sock=request.META.get("gunicorn.socket"),
            wsgi_input=request.META.get("wsgi.input"),
            gate=GATE,
        )
        try:
            buffer = bytearray(expected)  # allocated only once admitted
            view = memoryview(buffer)
            received = 0
            while received < expected:
                chunk = stream.read(min(READ_CHUNK, expected - received))
                view[received : received + len(chunk)] = chunk
                received += len(chunk)
            view.release()
        finally:
            stream.close()
        yield buffer
    finally:
        GATE.release(lease)


def diagnostics() -> dict[str, Any]:
    """The fallback gate's limits and state, for ``/health``: sizes in bytes, times in ms."""
    return {
        "max_file_bytes": settings.KNOWLEDGE_UPLOAD_MAX_BYTES,
        "max_concurrency": settings.KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY,
        "max_reserved_bytes": settings.KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES,
        "idle_timeout_ms": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS,
        "total_timeout_ms": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS,
        **GATE.snapshot(),
    }
