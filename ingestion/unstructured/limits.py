"""What goes to the remote parser, in which lane, within which limits.

* :func:`routes` - the complex formats sent to the parser when it is configured;
* :func:`admit` - the input cap and the heavy/standard classification, with ZIP containers
  inspected through :func:`ingestion.parsing.archive.inspect_zip` (central directory only,
  nothing inflated) so ZIP64, multi-disk, excessive-entry and excessive-expansion containers are
  refused before any request;
* :class:`Lanes` - the process-wide concurrency limit with the nested heavy lane.

Numbers come from the seed deployment guide ("Unstructured") through ``settings``
(docs/configuration.md): concurrency 2 with a heavy lane of 1, input cap 15 MiB (at most
50 MiB), response cap 32 MiB, total deadlines 600 s and 2,400 s (at most 3,600 s).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings

from ingestion.parsing import archive

from .errors import ParserInputTooLarge, ParserNotConfigured

PDF = "application/pdf"
#: ZIP-based formats: heavy when the body exceeds 8 MiB or the central directory is large.
ZIP_FORMATS: dict[str, str] = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
    "application/epub+zip": ".epub",
    "application/vnd.oasis.opendocument.text": ".odt",
}
#: Opaque containers (legacy Office, RTF, mail): always heavy (seed: "conservatively").
OPAQUE_FORMATS: dict[str, str] = {
    "application/msword": ".doc",
    "application/vnd.ms-excel": ".xls",
    "application/vnd.ms-powerpoint": ".ppt",
    "application/rtf": ".rtf",
    "text/rtf": ".rtf",
    "message/rfc822": ".eml",
    "application/vnd.ms-outlook": ".msg",
}
#: Every MIME type :func:`routes` sends to the parser, with the extension the upload is sent
#: under (the parser detects types partly by extension; ours is sniffed from the content).
ROUTED: dict[str, str] = {PDF: ".pdf", **ZIP_FORMATS, **OPAQUE_FORMATS}

_ALIASES = {
    "application/x-rtf": "application/rtf",
    "application/x-msg": "application/vnd.ms-outlook",
}


def normalize(mime_type: str) -> str:
    """Lower-cased MIME type without parameters, common aliases mapped."""
    base = (mime_type or "").split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def routes(mime_type: str) -> bool:
    """Whether ``mime_type`` is a complex format the remote parser takes when configured: PDF,
    DOCX, PPTX, XLSX, EPUB, ODT, legacy Word/Excel/PowerPoint, RTF, EML and MSG. Plain text,
    Markdown, CSV, HTML and images stay on the native parsers."""
    return normalize(mime_type) in ROUTED


@dataclass(frozen=True)
class Limits:
    """The client's settings, read from ``django.conf.settings`` (see docs/configuration.md).

    Attributes:
        url: ``UNSTRUCTURED_API_URL`` without the endpoint path ("" = not configured).
        api_key: ``UNSTRUCTURED_API_KEY`` ("" = none), sent as ``unstructured-api-key``.
        max_concurrency: ``UNSTRUCTURED_MAX_CONCURRENCY`` (2).
        heavy_max_concurrency: ``UNSTRUCTURED_HEAVY_MAX_CONCURRENCY`` (1, nested in the former).
        max_input_bytes: ``UNSTRUCTURED_MAX_INPUT_BYTES`` (15 MiB, at most 50 MiB).
        max_response_bytes: ``UNSTRUCTURED_MAX_RESPONSE_BYTES`` (32 MiB).
        timeout_s: ``UNSTRUCTURED_REQUEST_TIMEOUT_MS`` / 1000 (600 s), total per call.
        heavy_timeout_s: ``UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS`` / 1000 (2,400 s).
        max_retries: ``UNSTRUCTURED_MAX_RETRIES`` (0).
        strategy: ``UNSTRUCTURED_STRATEGY`` ("auto").
    """

    url: str
    api_key: str
    max_concurrency: int
    heavy_max_concurrency: int
    max_input_bytes: int
    max_response_bytes: int
    timeout_s: float
    heavy_timeout_s: float
    max_retries: int
    strategy: str

    @classmethod
    def from_settings(cls) -> Limits:
        """Current values (tests may change settings between calls)."""
        return cls(
            url=getattr(settings, "UNSTRUCTURED_API_URL", "") or "",
            api_key=getattr(settings, "UNSTRUCTURED_API_KEY", "") or "",
            max_concurrency=settings.UNSTRUCTURED_MAX_CONCURRENCY,
            heavy_max_concurrency=settings.UNSTRUCTURED_HEAVY_MAX_CONCURRENCY,
            max_input_bytes=settings.UNSTRUCTURED_MAX_INPUT_BYTES,
            max_response_bytes=settings.UNSTRUCTURED_MAX_RESPONSE_BYTES,
            timeout_s=settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS / 1000,
            heavy_timeout_s=settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS / 1000,
            max_retries=settings.UNSTRUCTURED_MAX_RETRIES,
            strategy=getattr(settings, "UNSTRUCTURED_STRATEGY", "auto"),
        )

    def require_url(self) -> str:
        """The parser's base URL; :class:`ParserNotConfigured` when unset."""
        if not self.url:
            raise ParserNotConfigured("the remote parser is not configured (UNSTRUCTURED_API_URL)")
        return self.url


def admit(data: bytes, mime_type: str, limits: Limits) -> bool:
    """Check ``data`` against the input cap and classify it; returns whether it is heavy.

    Heavy (seed deployment guide): every PDF; legacy Office, RTF and mail; a ZIP-based format
    whose body exceeds 8 MiB or whose central directory declares more than 64 MiB expanded or
    more than 2,000 entries (:func:`ingestion.parsing.archive.is_heavy`).

    Raises:
        ParserInputTooLarge: ``len(data)`` over ``UNSTRUCTURED_MAX_INPUT_BYTES``.
        ArchiveRejected: a ZIP64, multi-disk, excessive-entry or excessive-expansion container
            (code ``archive_rejected``), found without inflating anything.
        CorruptDocument: a ZIP-based format whose central directory is unreadable.
    """
    if len(data) > limits.max_input_bytes:
        raise ParserInputTooLarge(
            f"the document is {len(data)} bytes, over the remote parser's input limit of "
            f"{limits.max_input_bytes} bytes (UNSTRUCTURED_MAX_INPUT_BYTES)"
        )
    mime = normalize(mime_type)
    if mime in ZIP_FORMATS:
        return archive.is_heavy(archive.inspect_zip(data), len(data))
    return mime == PDF or mime in OPAQUE_FORMATS


class Lanes:
    """The process-wide limit on parser requests with the nested heavy lane.

    A heavy request takes a heavy slot first and then an ordinary one (one fixed order, so no
    deadlock, and a heavy request waiting for its lane holds no ordinary slot); a standard
    request takes an ordinary slot only. So at most ``total`` requests run at once, at most
    ``heavy`` of them heavy. Waiting for a slot is not bounded here: every holder is bounded by
    its own deadline.
    """

    def __init__(self, total: int, heavy: int) -> None:
        if not 1 <= heavy <= total:
            raise ValueError(f"heavy lane {heavy} must be within 1..{total}")
        self.total = total
        self.heavy = heavy
        self._total = threading.BoundedSemaphore(total)
        self._heavy = threading.BoundedSemaphore(heavy)

    @contextlib.contextmanager
    def slot(self, heavy: bool) -> Iterator[None]:
        """Hold one slot (and a heavy one when ``heavy``) for the ``with`` block."""
        if heavy:
            self._heavy.acquire()
        try:
            with self._total:
                yield
        finally:
            if heavy:
                self._heavy.release()


_lanes_lock = threading.Lock()
_lanes: Lanes | None = None


def lanes(limits: Limits) -> Lanes:
    """The process's :class:`Lanes` for the configured limits (re-created only when the
    settings change, which happens in tests)."""
    global _lanes
    with _lanes_lock:
        if _lanes is None or (_lanes.total, _lanes.heavy) != (
            limits.max_concurrency,
            limits.heavy_max_concurrency,
        ):
            _lanes = Lanes(limits.max_concurrency, limits.heavy_max_concurrency)
        return _lanes


def _after_fork() -> None:
    global _lanes, _lanes_lock
    _lanes_lock = threading.Lock()
    _lanes = None  # slots held by the parent's threads are not the child's


os.register_at_fork(after_in_child=_after_fork)
