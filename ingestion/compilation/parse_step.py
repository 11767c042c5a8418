"""The parse step: read a document's source and parse it into an unsaved parse artifact.

Complex formats go to the Unstructured-compatible service when it is configured, everything
else to the isolated native parser; every parser failure becomes a :class:`CompilationFailure`
with the parser's code and retry class.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from django.conf import settings

from ingestion import parsing, unstructured
from ingestion.compilation.assets import store_assets
from ingestion.compilation.errors import CompilationFailure
from ingestion.compilation.leases import Held
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.models import CompilationJob, ParseArtifact, Stage
from ingestion.parsing.mail_container import is_wrapped
from ingestion.retained_bytes import estimate_retained_bytes
from knowledgefs import storage

if TYPE_CHECKING:
    from ingestion.revisions import Source


def _parse(job: CompilationJob, held: Held | None = None) -> ParseArtifact:
    """Read and parse the document; returns an unsaved :class:`ParseArtifact`.

    Complex formats go to the Unstructured-compatible parser when ``UNSTRUCTURED_API_URL`` is
    set (:func:`_parse_remote`), everything else (and an e-mail file saved as UTF-16/32 or behind
    an mbox envelope line, which the native parser unwraps) to the isolated native parser,
    except small plain text, parsed in this process (:func:`in_process`). A job at
    ``queued`` has no artifact yet: the artifact is only ever written in the same transaction
    as the ``parsed`` checkpoint.
    """
    from ingestion.revisions import Source

    document = Source(job)  # the revision's source (name, type, size, key)
    try:
        data = storage.read_object(
            document.storage_key,
            max_bytes=max(document.size_bytes, settings.KNOWLEDGE_UPLOAD_MAX_BYTES),
        )
    except FileNotFoundError:
        raise CompilationFailure(
            "source_missing", "the stored source file of this document is missing"
        ) from None
    except OSError as exc:
        raise CompilationFailure(  # no server paths in the message
            "source_unavailable",
            f"could not read the stored source ({type(exc).__name__}: {exc.strerror or 'error'})",
            retryable=True,
        ) from exc
    if (
        unstructured.enabled()
        and unstructured.routes(document.mime_type)
        and not (document.mime_type == "message/rfc822" and is_wrapped(data))
    ):
        report = _parse_remote(data, document, held)
    elif in_process(data, document.mime_type):
        report = _parse_in_process(data, document.mime_type)
    else:
        report = _parse_isolated(
            data, document.mime_type, _stop_check(job, held), _page_reporter(job, held)
        )
    elements = [_element_dict(e) for e in report.elements]
    artifact_hash = hashlib.sha256(
        json.dumps(elements, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    assets = store_assets(job, report.assets)
    # Ids, not instances: assigning the job would cache the artifact on it (a one-to-one
    # reverse cache) and keep it alive as long as the batch holds the job.
    # A compiled job has its document (deleting the document cancels its jobs first).
    assert job.document_id is not None
    return ParseArtifact(
        job_id=job.id,
        document_id=job.document_id,
        parser=report.parser,
        artifact_hash=artifact_hash,
        page_count=report.page_count,
        pages_without_text=list(report.pages_without_text),
        elements=elements,
        assets=assets,
        ocr_pages=list(report.ocr_pages),
        warnings=[w[:500] for w in report.warnings[:200]],
        retained_bytes=estimate_retained_bytes(
            elements, settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES
        ),
    )


# Parse failures a later attempt may cure: the rasterizer's process group was killed, so a retry
# cannot pile up work (unlike a parser that may still be running, see TRANSIENT_ERRORS).
RETRYABLE_PARSE_CODES = frozenset({"rasterization_timeout", "ocr_timeout", "rasterizer_busy"})
# Sources parsed in the worker itself, without the isolated child: plain text up to
# IN_PROCESS_MAX_BYTES. Its parse is our own decoding (charset detection on non-UTF-8 bytes) and
# paragraph splitting: no native library, no loop a damaged file can make endless, so the
# child's hard timeout and memory cap guard nothing there, while starting the child cost about
# 9 ms per document, half of the pipeline's own time per SciFact abstract (docs/benchmarks.md).
# Markdown keeps the child (its parser library is third-party code).
IN_PROCESS_TYPES = frozenset({"text/plain"})
IN_PROCESS_MAX_BYTES = 256 * 1024


def in_process(data: bytes, mime_type: str) -> bool:
    """Whether ``data`` of ``mime_type`` is parsed in the worker (:data:`IN_PROCESS_TYPES`, at
    most :data:`IN_PROCESS_MAX_BYTES`)."""
    return (
        len(data) <= IN_PROCESS_MAX_BYTES
        and parsing.normalize_mime_type(mime_type) in IN_PROCESS_TYPES
    )


def _parse_in_process(data: bytes, mime_type: str) -> parsing.ParseReport:
    """:func:`ingestion.parsing.parse_with_report` in this process, its errors mapped as
    :func:`_parse_isolated` maps them."""
    try:
        return parsing.parse_with_report(data, mime_type)
    except parsing.ParseError as exc:
        raise _failure(exc) from exc


def _failure(exc: parsing.ParseError) -> CompilationFailure:
    """The parser's error as a compilation failure, retryable only for
    :data:`RETRYABLE_PARSE_CODES`."""
    return CompilationFailure(exc.code, exc.message, retryable=exc.code in RETRYABLE_PARSE_CODES)


def _stop_check(job: CompilationJob, held: Held | None):
    """``should_stop`` for the isolated parse: the job was canceled or taken over (a lease
    read at most once a second); ``None`` without a lease holder."""
    if held is None:
        return None
    return lambda: held.is_lost(job.id)


def _page_reporter(job: CompilationJob, held: Held | None):
    """``on_pages`` for the isolated parse: the job's progress says which pages are parsed
    (``pages_parsed`` of ``pages_total``, the percent moving within the parse's share) and the
    lease is renewed; ``None`` without a lease holder (case BC-43)."""
    if held is None:
        return None
    start = [1]  # the first page of the range parsed since the last report

    def report(done: int, total: int) -> None:
        first, start[0] = start[0], done + 1
        span = f"page {done}" if first >= done else f"pages {first}–{done}"
        percent = PROGRESS[Stage.PARSED] * done // max(total, 1)
        note = f"parsed {span} of {total}"
        held.beat(
            {job.id: _progress("parsing", note, min(percent, PROGRESS[Stage.PARSED] - 1),
                               pages_parsed=done, pages_total=total)}
        )  # fmt: skip

    return report


def _parse_isolated(
    data: bytes, mime_type: str, should_stop=None, on_pages=None
) -> parsing.ParseReport:
    """Parse in the isolated child (:mod:`ingestion.parsing.isolation`); failures mapped to
    :class:`CompilationFailure`: the parser's code (retryable only for
    :data:`RETRYABLE_PARSE_CODES`), or the terminal ``parser_timeout`` after the hard limit.
    When ``should_stop`` answers true (the job was canceled) the parse is killed within about
    a second and :class:`~ingestion.parsing.isolation.ParseCanceled` propagates."""
    from ingestion.parsing import isolation, rasterize

    try:
        return isolation.parse_isolated(
            data,
            mime_type,
            config=isolation.IsolationConfig.from_settings(),
            raster=rasterize.RasterConfig.from_settings(),
            should_stop=should_stop,
            on_pages=on_pages,
        )
    except parsing.ParseError as exc:
        raise _failure(exc) from exc
    except TimeoutError as exc:
        # Terminal on purpose: a document that needs longer than the limit will again.
        raise CompilationFailure(
            "parser_timeout", f"the parser did not answer in time ({exc}); retry manually"
        ) from exc


def _parse_remote(data: bytes, document: Source, held: Held | None) -> parsing.ParseReport:
    """Parse through the Unstructured-compatible service (:mod:`ingestion.unstructured`).

    The call is bounded by its own total deadline (600 s, 2,400 s heavy), so the lease keeper
    is told to expect no progress for that long. Failures become :class:`CompilationFailure`
    with the client's code; only ``parser_unavailable`` is retryable (transport timeouts are
    terminal: the parser may still be working). A format the service does not support
    (HTTP 415) is parsed natively instead, with a warning in the artifact.
    """
    from ingestion.unstructured.errors import ParserRejected, UnstructuredError

    if held is not None:
        held.expect_quiet(
            max(
                settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS,
                settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS,
            )
            / 1000
        )
    try:
        return unstructured.parse_remote(data, document.mime_type, document.filename)
    except ParserRejected as exc:
        if exc.status != 415:
            raise CompilationFailure(exc.code, exc.message) from exc
        report = _parse_isolated(data, document.mime_type)
        note = "the remote parser does not support this format (HTTP 415); parsed natively"
        return dataclasses.replace(report, warnings=[note, *report.warnings])
    except UnstructuredError as exc:
        raise CompilationFailure(exc.code, exc.message, retryable=exc.retryable) from exc
    except parsing.ParseError as exc:  # refused before sending, e.g. archive_rejected
        raise CompilationFailure(exc.code, exc.message) from exc
    finally:
        if held is not None:
            held.touch()


def _element_dict(element: parsing.Element) -> dict:
    data = asdict(element)
    data["section_path"] = list(element.section_path)
    return data
