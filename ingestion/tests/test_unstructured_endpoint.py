"""The local Unstructured-compatible endpoint (ingestion/unstructured/server.py) started from
``.venv-unstructured`` on loopback, parsing the shared sample documents through the client.

Skips with a reason when ``.venv-unstructured`` is missing (``make unstructured`` creates it),
unless ``KFS_REQUIRE_UNSTRUCTURED=1``; the scanned PDF also needs Debian's tesseract
(``KFS_REQUIRE_OCR=1`` makes its absence a failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import requests

import ingestion.unstructured as unstructured
from ingestion.unstructured import errors
from knowledgefs.testing.fixtures import shared_path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-unstructured" / "bin" / "python"
KEY = "local-endpoint-key-0123456789"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def _require_venv() -> None:
    if PYTHON.exists():
        return
    reason = f"{PYTHON} is missing: run `make unstructured`"
    if os.environ.get("KFS_REQUIRE_UNSTRUCTURED") == "1":
        pytest.fail(reason + " (KFS_REQUIRE_UNSTRUCTURED=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def endpoint():
    """The endpoint on a free loopback port, with an API key; yields its URL."""
    _require_venv()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UNSTRUCTURED_", "DJANGO"))}
    process = subprocess.Popen(
        [str(PYTHON), "-m", "ingestion.unstructured.server", "--port", "0", "--api-key", KEY],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True).start()
    try:
        line = ""
        timer = threading.Timer(180, process.kill)  # import and warm-up take a few seconds
        timer.start()
        try:
            line = process.stdout.readline()
        finally:
            timer.cancel()
        if not line.startswith("listening on "):
            process.kill()
            process.wait()
            pytest.fail(f"the endpoint did not start: {line!r} {''.join(stderr)[-2000:]}")
        yield line.removeprefix("listening on ").strip()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def remote(endpoint, settings):
    settings.UNSTRUCTURED_API_URL = endpoint
    settings.UNSTRUCTURED_API_KEY = KEY
    settings.UNSTRUCTURED_MAX_CONCURRENCY = 2
    settings.UNSTRUCTURED_HEAVY_MAX_CONCURRENCY = 1
    settings.UNSTRUCTURED_STRATEGY = "auto"
    return endpoint


def parse(name: str, mime: str):
    path = shared_path("data", "sample-docs", name)
    return unstructured.parse_remote(path.read_bytes(), mime, name)


def test_healthcheck_and_the_api_key(remote):
    assert requests.get(remote + "/healthcheck", timeout=10).json() == {
        "status": "ok",
        "unstructured": "0.27.35",
    }
    answer = requests.post(
        remote + "/general/v0/general", files={"files": ("a.txt", b"hello")}, timeout=10
    )
    assert answer.status_code == 401


def test_docx_tables_keep_header_and_cells(remote):
    report = parse("docx-tables.docx", DOCX)
    assert report.parser == "unstructured"
    tables = [e for e in report.elements if e.type == "table"]
    assert len(tables) == 3
    assert tables[0].metadata == {
        "header": ["Header Col 1", "Header Col 2"],
        "rows": [["Lorem ipsum", "A link example"]],
    }
    assert "| Lorem ipsum | A link example |" in tables[0].text
    assert any(e.text == "Table with merged cells" for e in report.elements)
    # rowspan/colspan carried to every cell they cover
    assert tables[2].metadata == {
        "header": None,
        "rows": [["a", "b", "b"], ["a", "c", "d"], ["e", "e", "d"]],
    }
    assert tables[2].text == "a | b | b\na | c | d\ne | e | d"


def test_xlsx_sheets_become_tables_with_their_sheet_names(remote):
    report = parse("stanley-cups.xlsx", XLSX)
    tables = [e for e in report.elements if e.type == "table"]
    assert [t.metadata["sheet"] for t in tables] == ["Stanley Cups", "Stanley Cups Since 67"]
    assert "| Maple Leafs | TOR | 13 |" in tables[0].text
    assert "| Maple Leafs | TOR | 0 |" in tables[1].text


def test_pptx_titles_and_bullets(remote):
    report = parse("fake-power-point.pptx", PPTX)
    heading = report.elements[0]
    assert (heading.type, heading.text) == ("heading", "Adding a Bullet Slide")
    bullets = [e.text for e in report.elements if e.type == "list"]
    assert "Find the bullet slide layout" in bullets
    assert all(e.section_path[0] == "Adding a Bullet Slide" for e in report.elements)


@pytest.mark.parametrize(
    ("name", "mime"),
    [("fake-email.eml", "message/rfc822"), ("fake-email.msg", "application/vnd.ms-outlook")],
)
def test_mail(remote, name, mime):
    texts = [e.text for e in parse(name, mime).elements]
    assert "This is a test email to use for unit tests." in texts


def test_a_pdf_with_a_text_layer_keeps_its_page(remote):
    report = parse("embedded-images-tables.pdf", "application/pdf")
    text = "\n".join(e.text for e in report.elements)
    assert "O. Sanni, A.P.I. Popoola / Data in Brief 22 (2019) 451–457" in text
    assert "Potentiodynamic polarization data for stainless steel" in text
    assert report.page_count == 1
    assert {e.page_number for e in report.elements} == {1}


def test_a_scanned_pdf_is_read_by_ocr(remote):
    if shutil.which("tesseract") is None:
        if os.environ.get("KFS_REQUIRE_OCR") == "1":
            pytest.fail("tesseract is missing (KFS_REQUIRE_OCR=1)")
        pytest.skip("tesseract (Debian tesseract-ocr) is not installed")
    report = parse("loremipsum-flat.pdf", "application/pdf")
    text = " ".join(e.text for e in report.elements)
    assert "Lorem ipsum dolor sit amet" in text
    assert report.page_count == 1


def test_epub_without_pandoc_is_refused_with_the_status(remote):
    with pytest.raises(errors.ParserRejected) as caught:
        parse("winter-sports.epub", "application/epub+zip")
    assert caught.value.status == 415
    assert "HTTP 415" in caught.value.message
    assert "this endpoint cannot partition this type" in caught.value.message
