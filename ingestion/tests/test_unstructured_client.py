"""The Unstructured-compatible parser client against a real HTTP server on loopback
(knowledgefs/testing/unstructured_server.py): limits, lanes, deadlines, retries, error codes,
element mapping, and the start-up validation of its settings."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ingestion.unstructured as unstructured
from ingestion.parsing import CorruptDocument, ParseError
from ingestion.parsing.archive import ArchiveRejected
from ingestion.unstructured import errors
from ingestion.unstructured.client import upload_name
from ingestion.unstructured.limits import Limits, admit
from knowledgefs.testing.unstructured_server import UnstructuredTestServer

ROOT = Path(__file__).resolve().parents[2]
PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
MIB = 1024 * 1024


def office_zip(entries: int = 3, *, entry_bytes: int = 100, stored_random: int = 0) -> bytes:
    """A ZIP container shaped like an Office document (the client inspects only its central
    directory): ``entries`` small parts, plus ``stored_random`` incompressible bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as container:
        container.writestr("[Content_Types].xml", "<Types/>")
        for i in range(entries - 1):
            container.writestr(f"word/part{i}.xml", "<w:p>" + "x" * entry_bytes + "</w:p>")
        if stored_random:
            container.writestr("word/media/blob.bin", os.urandom(stored_random), zipfile.ZIP_STORED)
    return buffer.getvalue()


PDF_BYTES = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


@pytest.fixture
def parser(settings):
    """A contract server with the seed's limits, short deadlines and no retries."""
    server = UnstructuredTestServer().start()
    settings.UNSTRUCTURED_API_URL = server.url
    settings.UNSTRUCTURED_API_KEY = ""
    settings.UNSTRUCTURED_MAX_CONCURRENCY = 2
    settings.UNSTRUCTURED_HEAVY_MAX_CONCURRENCY = 1
    settings.UNSTRUCTURED_MAX_INPUT_BYTES = 15 * MIB
    settings.UNSTRUCTURED_MAX_RESPONSE_BYTES = 32 * MIB
    settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS = 10_000
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 10_000
    settings.UNSTRUCTURED_MAX_RETRIES = 0
    settings.UNSTRUCTURED_STRATEGY = "auto"
    yield server
    server.stop()


# --- the happy path and the mapping -----------------------------------------------------------


def test_a_docx_is_sent_as_multipart_files_and_its_elements_are_mapped(parser):
    data = office_zip()
    report = unstructured.parse_remote(data, DOCX, "Quarterly report.docx")

    assert report.parser == "unstructured"
    [sent] = parser.requests
    assert sent.filename == "Quarterly report.docx"
    assert sent.content_type == DOCX
    assert sent.size == len(data)
    assert sent.fields["strategy"] == ["auto"]
    assert sent.fields["coordinates"] == ["false"]
    assert sent.api_key is None  # no key configured, no header
    heading, paragraph, table = report.elements
    assert (heading.type, heading.text, heading.level) == (
        "heading",
        "Report Quarterly report.docx",
        1,
    )
    assert paragraph.type == "paragraph"
    assert paragraph.text == f"The parser received {len(data)} bytes."
    assert paragraph.section_path == ("Report Quarterly report.docx",)
    assert paragraph.page_number is None and paragraph.metadata == {"page": 1}
    assert table.type == "table"
    assert table.text == "| Team | Cups |\n| --- | --- |\n| Blues | 1 |"
    assert table.metadata["header"] == ["Team", "Cups"]
    assert table.metadata["rows"] == [["Blues", "1"]]
    assert report.page_count is None


def test_a_pdf_keeps_page_numbers_and_is_sent_under_its_sniffed_extension(parser):
    report = unstructured.parse_remote(PDF_BYTES, "application/pdf; charset=binary", "scan.bin")
    assert parser.requests[0].filename == "scan.pdf"
    assert parser.requests[0].content_type == PDF
    assert [e.page_number for e in report.elements] == [1, 1, 1]
    assert report.page_count == 1 and report.pages_without_text == []


def test_the_api_key_travels_in_its_header_and_a_refusal_names_the_status(parser, settings):
    parser.api_key = "parser-key-0123456789"
    settings.UNSTRUCTURED_API_KEY = "parser-key-0123456789"
    unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert parser.requests[-1].api_key == "parser-key-0123456789"

    settings.UNSTRUCTURED_API_KEY = "wrong-key-0123456789"
    with pytest.raises(errors.ParserRejected) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_rejected" and caught.value.status == 401
    assert "HTTP 401" in caught.value.message
    assert "UNSTRUCTURED_API_KEY" in caught.value.message
    assert "wrong-key" not in caught.value.message


def test_upload_names_keep_the_stem_and_take_the_sniffed_extension():
    assert upload_name("C:\\docs\\Budget 2026.XLSX", XLSX) == "Budget 2026.xlsx"
    assert upload_name("../../etc/passwd", PDF) == "passwd.pdf"
    assert upload_name('we"ird\x00name.doc', DOCX) == "weirdname.docx"
    assert upload_name("", PDF) == "document.pdf"


def test_routes_and_enabled(settings):
    routed = [PDF, DOCX, XLSX, "application/epub+zip", "message/rfc822", "application/msword"]
    routed += ["application/vnd.ms-outlook", "application/rtf", "text/rtf"]
    routed += ["application/vnd.oasis.opendocument.text"]
    routed += ["application/vnd.openxmlformats-officedocument.presentationml.presentation"]
    for mime in routed:
        assert unstructured.routes(mime), mime
    for mime in ("text/plain", "text/markdown", "text/csv", "text/html", "image/png", ""):
        assert not unstructured.routes(mime), mime
    settings.UNSTRUCTURED_API_URL = ""
    assert unstructured.enabled() is False
    with pytest.raises(errors.ParserNotConfigured) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_not_configured"
    settings.UNSTRUCTURED_API_URL = "http://127.0.0.1:9"
    assert unstructured.enabled() is True


def test_native_formats_and_empty_files_are_refused_before_sending(parser):
    with pytest.raises(ParseError) as caught:
        unstructured.parse_remote(b"hello", "text/plain", "a.txt")
    assert caught.value.code == "unsupported_media_type"
    with pytest.raises(ParseError) as caught:
        unstructured.parse_remote(b"", PDF, "a.pdf")
    assert caught.value.code == "empty_file"
    assert parser.requests == []


# --- lanes ------------------------------------------------------------------------------------


def test_at_most_two_requests_and_one_heavy_request_reach_the_parser_at_once(parser):
    parser.add_fault("delay", times=None, seconds=0.3)
    docx = office_zip()
    jobs = [(PDF_BYTES, PDF, f"p{i}.pdf") for i in range(4)]
    jobs += [(docx, DOCX, f"d{i}.docx") for i in range(4)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        reports = list(pool.map(lambda job: unstructured.parse_remote(*job), jobs))

    assert [r.parser for r in reports] == ["unstructured"] * 8
    assert len(parser.requests) == 8
    assert parser.peak("*") == 2  # the process-wide limit was reached, never passed
    assert parser.peak(".pdf") == 1  # every PDF is heavy: the nested lane holds one


def test_a_wider_configuration_is_honoured(parser, settings):
    settings.UNSTRUCTURED_MAX_CONCURRENCY = 3
    settings.UNSTRUCTURED_HEAVY_MAX_CONCURRENCY = 2
    parser.add_fault("delay", times=None, seconds=0.3)
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda i: unstructured.parse_remote(PDF_BYTES, PDF, f"{i}.pdf"), range(6)))
    assert parser.peak(".pdf") == 2


def test_heavy_classification(settings):
    limits = Limits.from_settings()
    assert admit(PDF_BYTES, PDF, limits) is True  # every PDF
    assert admit(b"From: a@b\n\nhi", "message/rfc822", limits) is True  # mail
    assert admit(b"{\\rtf1 hi}", "application/rtf", limits) is True
    assert admit(b"\xd0\xcf\x11\xe0", "application/msword", limits) is True  # legacy Office
    assert admit(office_zip(), DOCX, limits) is False  # a small ZIP-based document
    assert admit(office_zip(2_001), DOCX, limits) is True  # many entries
    assert admit(office_zip(2, stored_random=9 * MIB), DOCX, limits) is True  # over 8 MiB
    # 65 MiB declared expansion in parts of 1 MiB (under the per-entry ratio check), a small body
    assert admit(office_zip(66, entry_bytes=MIB - 16), XLSX, limits) is True


# --- refused before any request ---------------------------------------------------------------


def _zip64(monkeypatch) -> bytes:
    """A genuine ZIP64 container written by :mod:`zipfile` (its ZIP64 thresholds lowered so a
    small document gets the ZIP64 end record, locator and extra fields)."""
    with monkeypatch.context() as patch:
        patch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
        patch.setattr(zipfile, "ZIP64_LIMIT", 16)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as container:
            container.writestr("[Content_Types].xml", "<Types/>" * 10)
            container.writestr("word/document.xml", "<w:document/>" * 10)
        return buffer.getvalue()


def _multi_disk() -> bytes:
    data = bytearray(office_zip())
    end = data.rfind(b"PK\x05\x06")
    data[end + 4 : end + 6] = (1).to_bytes(2, "little")  # "this is disk 1"
    return bytes(data)


def test_bombs_zip64_and_spanned_containers_never_reach_the_parser(parser, monkeypatch):
    cases = {
        "zip64": _zip64(monkeypatch),
        "multi-disk": _multi_disk(),
        "entries": office_zip(10_001, entry_bytes=1),
        "expansion": office_zip(2, entry_bytes=257 * MIB),
    }
    for name, data in cases.items():
        assert len(data) < 2 * MIB, name
        with pytest.raises(ArchiveRejected) as caught:
            unstructured.parse_remote(data, DOCX, f"{name}.docx")
        assert caught.value.code == "archive_rejected", name
    with pytest.raises(CorruptDocument):
        unstructured.parse_remote(b"PK\x03\x04 not really a zip", DOCX, "broken.docx")
    assert parser.requests == []


def test_the_input_cap_is_checked_before_sending_and_named(parser, settings):
    settings.UNSTRUCTURED_MAX_INPUT_BYTES = 1000
    with pytest.raises(errors.ParserInputTooLarge) as caught:
        unstructured.parse_remote(b"%PDF" + b"x" * 997, PDF, "big.pdf")
    assert caught.value.code == "parser_input_too_large"
    assert "1001 bytes" in caught.value.message
    assert "1000 bytes (UNSTRUCTURED_MAX_INPUT_BYTES)" in caught.value.message
    assert parser.requests == []
    unstructured.parse_remote(b"%PDF" + b"x" * 996, PDF, "fits.pdf")  # exactly the cap
    assert len(parser.requests) == 1


# --- the response cap and the deadline --------------------------------------------------------


def test_a_huge_streamed_body_stops_at_the_response_cap(parser, settings):
    settings.UNSTRUCTURED_MAX_RESPONSE_BYTES = 64 * 1024
    parser.add_fault("huge", size=8 * MIB)
    with pytest.raises(errors.ParserResponseTooLarge) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_response_too_large"
    assert "65536 bytes (UNSTRUCTURED_MAX_RESPONSE_BYTES)" in caught.value.message


def test_a_declared_oversized_body_is_refused_before_reading(parser, settings):
    settings.UNSTRUCTURED_MAX_RESPONSE_BYTES = 64 * 1024
    parser.add_fault("declared", size=40 * MIB)
    started = time.monotonic()
    with pytest.raises(errors.ParserResponseTooLarge) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert time.monotonic() - started < 5  # the server holds the body for 30 s
    assert f"declares {40 * MIB} bytes" in caught.value.message


def test_the_deadline_covers_a_slow_body_and_a_timeout_is_terminal(parser, settings):
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 1500
    settings.UNSTRUCTURED_MAX_RETRIES = 3
    parser.add_fault("slow_body", interval=0.05)  # ~300 bytes: about 15 s
    started = time.monotonic()
    with pytest.raises(errors.ParserTimeout) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "slow.pdf")
    elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 6, elapsed
    assert caught.value.code == "parser_timeout" and caught.value.retryable is False
    assert "within 1.5 s" in caught.value.message
    assert "inspect the parser and retry manually" in caught.value.message
    assert len(parser.requests) == 1  # never retried inline


def test_a_hung_parser_times_out_on_the_standard_deadline(parser, settings):
    settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS = 1000
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 60_000
    settings.UNSTRUCTURED_MAX_RETRIES = 2
    parser.add_fault("hang")
    started = time.monotonic()
    with pytest.raises(errors.ParserTimeout) as caught:
        unstructured.parse_remote(office_zip(), DOCX, "hung.docx")  # a standard document
    assert time.monotonic() - started < 5
    assert "within 1 s" in caught.value.message
    assert len(parser.requests) == 1
    unstructured.parse_remote(office_zip(), DOCX, "next.docx")  # the client is still usable


# --- retries and statuses ---------------------------------------------------------------------


def test_retryable_statuses_are_retried_up_to_the_setting(parser, settings):
    settings.UNSTRUCTURED_MAX_RETRIES = 2
    parser.add_fault("status", times=2, status=503, retry_after="0")
    report = unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert report.elements[0].text == "Report a.pdf"
    assert [r.status for r in parser.requests] == [503, 503, 200]

    parser.requests.clear()
    settings.UNSTRUCTURED_MAX_RETRIES = 1
    parser.add_fault("status", times=3, status=429, retry_after="0", detail="slow down")
    with pytest.raises(errors.ParserUnavailable) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_unavailable" and caught.value.retryable is True
    assert "HTTP 429" in caught.value.message and "slow down" in caught.value.message
    assert len(parser.requests) == 2


def test_no_inline_retry_by_default(parser):
    parser.add_fault("status", times=1, status=502, retry_after="0")
    with pytest.raises(errors.ParserUnavailable):
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert len(parser.requests) == 1


def test_a_retry_after_beyond_the_deadline_ends_the_call_at_once(parser, settings):
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 3000
    settings.UNSTRUCTURED_MAX_RETRIES = 3
    parser.add_fault("status", times=1, status=503, retry_after="60")
    started = time.monotonic()
    with pytest.raises(errors.ParserUnavailable):
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert time.monotonic() - started < 3  # no 60 s wait
    assert len(parser.requests) == 1


@pytest.mark.parametrize(
    ("status", "error", "code"),
    [
        (500, errors.ParserFailed, "parser_failed"),
        (422, errors.ParserRejected, "parser_rejected"),
        (415, errors.ParserRejected, "parser_rejected"),
    ],
)
def test_other_statuses_are_terminal_and_named(parser, settings, status, error, code):
    settings.UNSTRUCTURED_MAX_RETRIES = 3
    parser.add_fault("status", times=1, status=status, detail="cannot partition this file")
    with pytest.raises(error) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == code and caught.value.status == status
    assert f"HTTP {status}" in caught.value.message
    assert "cannot partition this file" in caught.value.message
    assert len(parser.requests) == 1


def test_malformed_and_wrongly_shaped_answers(parser):
    parser.add_fault("malformed")
    with pytest.raises(errors.ParserInvalidResponse) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_invalid_response"
    assert "not JSON" in caught.value.message

    parser.elements = {"detail": "ok"}  # type: ignore[assignment]
    with pytest.raises(errors.ParserInvalidResponse) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert "not a list" in caught.value.message

    parser.elements = [{"type": "Title"}]
    with pytest.raises(errors.ParserInvalidResponse) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert "element 0" in caught.value.message


def test_an_empty_answer_is_never_a_success(parser):
    for elements in ([], [{"type": "PageBreak", "text": ""}, {"type": "Text", "text": "  \n"}]):
        parser.elements = elements
        with pytest.raises(errors.ParserEmptyOutput) as caught:
            unstructured.parse_remote(PDF_BYTES, PDF, "empty.pdf")
        assert caught.value.code == "parser_empty_output"
        assert "'empty.pdf'" in caught.value.message


def test_connection_refused_is_retryable_and_not_retried_inline(settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.UNSTRUCTURED_API_URL = f"http://127.0.0.1:{port}"
    settings.UNSTRUCTURED_MAX_RETRIES = 3
    started = time.monotonic()
    with pytest.raises(errors.ParserUnavailable) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert time.monotonic() - started < 3  # no retry, no backoff
    assert caught.value.code == "parser_unavailable" and caught.value.retryable is True
    assert "ConnectionRefusedError" in caught.value.message
    assert "not sent" in caught.value.message


def test_a_connection_dropped_after_sending_is_terminal(parser, settings):
    settings.UNSTRUCTURED_MAX_RETRIES = 3
    parser.add_fault("drop")
    with pytest.raises(errors.ParserConnectionLost) as caught:
        unstructured.parse_remote(PDF_BYTES, PDF, "a.pdf")
    assert caught.value.code == "parser_connection_lost" and caught.value.retryable is False
    assert len(parser.requests) == 1


# --- start-up validation ----------------------------------------------------------------------

NAMES = (
    "UNSTRUCTURED_API_URL",
    "UNSTRUCTURED_API_KEY",
    "UNSTRUCTURED_MAX_CONCURRENCY",
    "UNSTRUCTURED_HEAVY_MAX_CONCURRENCY",
    "UNSTRUCTURED_PDF_MAX_CONCURRENCY",
    "UNSTRUCTURED_MAX_INPUT_BYTES",
    "UNSTRUCTURED_MAX_RESPONSE_BYTES",
    "UNSTRUCTURED_REQUEST_TIMEOUT_MS",
    "UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS",
    "UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS",
    "UNSTRUCTURED_MAX_RETRIES",
    "UNSTRUCTURED_STRATEGY",
)


def setup_django(**overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(DJANGO_SETTINGS_MODULE="knowledgefs.settings", **overrides)
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        f"print(*[getattr(s, n) for n in {[n for n in NAMES if 'PDF' not in n]!r}], sep='|')"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_settings_defaults_are_the_seed_numbers():
    result = setup_django()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split("|") == [
        "", "", "2", "1", str(15 * MIB), str(32 * MIB), "600000", "2400000", "0", "auto",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"UNSTRUCTURED_HEAVY_MAX_CONCURRENCY": "3"},
            "UNSTRUCTURED_HEAVY_MAX_CONCURRENCY=3 exceeds UNSTRUCTURED_MAX_CONCURRENCY=2",
        ),
        (
            {"UNSTRUCTURED_MAX_CONCURRENCY": "1", "UNSTRUCTURED_PDF_MAX_CONCURRENCY": "2"},
            "UNSTRUCTURED_PDF_MAX_CONCURRENCY=2 exceeds UNSTRUCTURED_MAX_CONCURRENCY=1",
        ),
        (
            {"UNSTRUCTURED_MAX_INPUT_BYTES": str(50 * MIB + 1)},
            f"UNSTRUCTURED_MAX_INPUT_BYTES={50 * MIB + 1} is outside the accepted range "
            f"1..{50 * MIB}",
        ),
        (
            {"UNSTRUCTURED_REQUEST_TIMEOUT_MS": "3600001"},
            "UNSTRUCTURED_REQUEST_TIMEOUT_MS=3600001 is outside the accepted range 1000..3600000",
        ),
        (
            {"UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS": "3600001"},
            "UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS=3600001 is outside the accepted range",
        ),
        ({"UNSTRUCTURED_MAX_RETRIES": "11"}, "accepted range 0..10"),
        ({"UNSTRUCTURED_API_URL": "ftp://parser"}, "UNSTRUCTURED_API_URL must be an http://"),
        ({"UNSTRUCTURED_API_URL": "http://u:p@parser:8000"}, "must not carry credentials"),
        ({"UNSTRUCTURED_API_URL": "http://parser:99999"}, "UNSTRUCTURED_API_URL has an invalid"),
        ({"UNSTRUCTURED_STRATEGY": "vlm"}, "UNSTRUCTURED_STRATEGY='vlm' is not one of"),
    ],
)
def test_bad_settings_stop_start_up_naming_the_limit(variables, message):
    result = setup_django(**variables)
    assert result.returncode != 0
    assert message in result.stderr


def test_the_compatibility_aliases_have_lower_precedence():
    result = setup_django(
        UNSTRUCTURED_API_URL="http://knowledge_fs_unstructured:8000/general/v0/general",
        UNSTRUCTURED_MAX_CONCURRENCY="4",
        UNSTRUCTURED_PDF_MAX_CONCURRENCY="3",
        UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS="1200000",
    )
    assert result.returncode == 0, result.stderr
    values = result.stdout.strip().split("|")
    assert values[0] == "http://knowledge_fs_unstructured:8000"
    assert values[3] == "3" and values[7] == "1200000"
    result = setup_django(
        UNSTRUCTURED_MAX_CONCURRENCY="4",
        UNSTRUCTURED_HEAVY_MAX_CONCURRENCY="2",
        UNSTRUCTURED_PDF_MAX_CONCURRENCY="3",
        UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS="900000",
        UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS="1200000",
    )
    values = result.stdout.strip().split("|")
    assert values[3] == "2" and values[7] == "900000"
