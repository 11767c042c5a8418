"""PDF documents end to end: passwords (BC-13), OCR of image-only pages (BC-14), tables, page
images stored through the storage boundary, image documents, and the PDF sample documents.

Real PDFs built with reportlab/pypdf, real pdftoppm and tesseract (skipped when missing unless
``KFS_REQUIRE_OCR=1``), real compilation and queries.
"""

from __future__ import annotations

import hashlib
import io
import time
from datetime import timedelta

import pytest
from reportlab.lib import colors
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas
from reportlab.platypus import Paragraph, SimpleDocTemplate, Table, TableStyle

from ingestion.compilation.parse_step import RETRYABLE_PARSE_CODES
from ingestion.compilation.pipeline import run_job
from ingestion.compilation.recovery import drain_queued, recover_jobs
from ingestion.documents import admit_document, purge_documents
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact
from ingestion.parsing import ParseError, parse_with_report
from ingestion.parsing.ocr import parse_image
from knowledgefs import boundary, storage
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import OBJECT, TEST_INNER_KEY
from knowledgefs.testing.fixtures import shared_path, upload
from knowledgefs.testing.pdf_fixtures import (
    bc14_pdf,
    encrypt,
    png_bytes,
    require_ocr,
    text_image,
    text_pdf,
)
from retrieval.modes import retrieve

PDF = "application/pdf"

dify_server = dify_fixtures.dify_server


def _compile(space, data: bytes, name: str) -> Document:
    admission = admit_document(space, filename=name, data=data, enqueue=False)
    run_job(admission.job.id)
    return Document.objects.get(id=admission.document.id)


def _artifact(document: Document) -> ParseArtifact:
    return ParseArtifact.objects.get(document=document)


# --- BC-13: passwords ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_bc13_a_user_password_fails_encrypted_pdf_at_once_without_retry(space):
    data = encrypt(text_pdf([["Top secret quarterly numbers."]]), user="secret", owner="owner")
    started = time.monotonic()
    document = _compile(space, data, "locked.pdf")
    elapsed = time.monotonic() - started
    job = CompilationJob.objects.get(document=document)
    assert (document.state, document.error_code) == ("failed", "encrypted_pdf")
    assert document.error_message == "encrypted PDF, password required"
    assert (job.run_state, job.execution_attempts, job.error_retryable) == ("failed", 1, False)
    assert elapsed < 10, elapsed
    assert not KnowledgeNode.objects.exists()


@pytest.mark.django_db
def test_bc13_an_owner_password_only_pdf_is_published(space):
    data = encrypt(text_pdf([["Owner restricted but readable text."]]), user="", owner="owner")
    document = _compile(space, data, "restricted.pdf")
    assert (document.state, document.error_code) == ("published", "")
    hits = retrieve(space, "owner restricted readable", top_k=3).items
    assert hits and "Owner restricted but readable text." in hits[0].text


def test_the_parser_reports_the_same_reason_as_the_job():
    data = encrypt(text_pdf([["x"]]), user="secret", owner="owner")
    with pytest.raises(ParseError) as exc:
        parse_with_report(data, PDF)
    assert (exc.value.code, exc.value.message) == (
        "encrypted_pdf",
        "encrypted PDF, password required",
    )


# --- BC-14: a page without a text layer ---------------------------------------------------------


@pytest.mark.django_db
def test_bc14_the_image_only_page_is_ocrd_searchable_with_page_numbers(space):
    require_ocr()
    report = parse_with_report(bc14_pdf(), PDF)
    assert (report.page_count, report.ocr_pages, report.pages_without_text) == (2, [2], [])
    document = _compile(space, bc14_pdf(), "invoice.pdf")
    assert document.state == "published", document.error_message
    nodes = list(KnowledgeNode.objects.filter(document=document))
    assert {n.page_number for n in nodes} == {1, 2}
    assert all(n.text.strip() for n in nodes)  # no empty or whitespace chunks
    hits = retrieve(space, "INVOICE 4711", top_k=5).items
    assert hits and "INVOICE 4711" in hits[0].text and hits[0].citation["page_number"] == 2
    ocr = [e for e in _artifact(document).elements if e["metadata"].get("ocr")]
    assert [(e["page_number"], e["text"]) for e in ocr] == [(2, "INVOICE 4711")]
    assert (_artifact(document).ocr_pages, _artifact(document).pages_without_text) == ([2], [])


@pytest.mark.django_db
def test_bc14_with_the_rasterizer_off_page_2_is_reported_without_text_layer(space, settings):
    settings.KNOWLEDGE_PDF_RASTERIZER = "off"
    report = parse_with_report(bc14_pdf(), PDF)
    assert (report.pages_without_text, report.ocr_pages) == ([2], [])
    assert report.warnings == ["page 2: no text layer (OCR unavailable: rasterizer off)"]
    document = _compile(space, bc14_pdf(), "invoice.pdf")
    assert document.state == "published"
    assert _artifact(document).pages_without_text == [2]
    assert _artifact(document).warnings == [
        "page 2: no text layer (OCR unavailable: rasterizer off)"
    ]
    assert _artifact(document).assets == []
    assert set(KnowledgeNode.objects.values_list("page_number", flat=True)) == {1}


@pytest.mark.django_db
def test_an_image_only_pdf_with_the_rasterizer_off_fails_naming_its_pages(space, settings):
    settings.KNOWLEDGE_PDF_RASTERIZER = "off"
    image_only = bc14_pdf()
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.add_page(PdfReader(io.BytesIO(image_only)).pages[1])
    out = io.BytesIO()
    writer.write(out)
    document = _compile(space, out.getvalue(), "scan.pdf")
    assert (document.state, document.error_code) == ("failed", "no_extractable_text")
    assert "pages without a text layer: 1" in document.error_message


# --- page images through the storage boundary ---------------------------------------------------


@pytest.mark.django_db
def test_page_images_are_stored_referenced_and_deleted_with_the_document(space):
    require_ocr()
    document = _compile(space, bc14_pdf(), "invoice.pdf")
    assets = _artifact(document).assets
    assert [(a["kind"], a["page_number"]) for a in assets] == [
        ("page_image", 2),
        ("thumbnail", 2),
    ]
    job = CompilationJob.objects.get(document=document)
    image, thumb = assets
    assert image["key"] == f"assets/{space.id}/{document.id}/{job.id}/0.png"
    # 144 DPI crop of the 468 x 120 pt image; a 48 DPI thumbnail of the letter page.
    assert (image["width"], image["height"]) == (936, 240)
    assert (thumb["width"], thumb["height"]) == (408, 528)
    for asset in assets:
        data = storage.read_object(asset["key"], max_bytes=10**7)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert (len(data), hashlib.sha256(data).hexdigest()) == (asset["bytes"], asset["sha256"])
    elements = _artifact(document).elements
    assert elements[image["element_index"]]["text"] == "INVOICE 4711"
    purge_documents(Document.objects.filter(id=document.id))
    assert not any(storage.object_storage().exists(a["key"]) for a in assets)


@pytest.mark.django_db
def test_a_recompiled_document_drops_the_previous_generations_images(
    space, django_capture_on_commit_callbacks
):
    require_ocr()
    data = bc14_pdf()
    first = _compile(space, data, "invoice.pdf")
    old = _artifact(first).assets
    assert old
    again = admit_document(
        space, filename="invoice.pdf", data=data, on_duplicate="replace", enqueue=False
    )
    assert again.document.id == first.id
    with django_capture_on_commit_callbacks(execute=True):  # objects go once the rows have
        run_job(again.job.id)
    assert Document.objects.get(id=first.id).state == "published"
    assert not any(storage.object_storage().exists(a["key"]) for a in old)
    new = ParseArtifact.objects.get(job_id=again.job.id).assets
    assert all(storage.object_storage().exists(a["key"]) for a in new)


@pytest.fixture
def dify(settings, dify_server, space):
    """Object storage (and models) through the local Dify contract server."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 1500
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("dify", str(settings.OBJECT_STORAGE_DIR)),
    }
    return dify_server


@pytest.mark.timeout(120)
def test_page_images_go_to_dify_storage_and_a_failed_write_leaves_none(dify, client, space):
    require_ocr()
    assert upload(client, space, "invoice.pdf", bc14_pdf()).status_code == 202
    # Compiling reads the source (GET) and writes two images (PUT, PUT): the second write fails
    # three times, i.e. also after the transport's two inline retries.
    dify.add_fault("status", OBJECT, skip=2, times=3, status=503)
    drain_queued(wait_for_retries=False)
    job = CompilationJob.objects.get()
    assert (job.run_state, job.error_code, job.error_retryable) == (
        "retry_wait",
        "storage_unavailable",
        True,
    )
    assert job.error_message == "could not store the document's images (ObjectStorageError)"
    assert not [key for key in dify.objects if key.startswith("assets/")]  # the first one too
    assert not ParseArtifact.objects.exists()
    # The retry stores both and references them.
    assert recover_jobs(now=job.next_attempt_at + timedelta(seconds=1)).retries_due
    job.refresh_from_db()
    run_job(job.id, job.task_id)
    document = Document.objects.get()
    assert document.state == "published"
    keys = [a["key"] for a in _artifact(document).assets]
    assert len(keys) == 2 and all(key in dify.objects for key in keys)
    url = f"/v1/knowledge-spaces/{space.id}/documents/{document.id}"
    assert client.delete(url).status_code == 204
    assert dify.objects == {}


# --- tables -------------------------------------------------------------------------------------


def _table_pdf() -> bytes:
    buffer = io.BytesIO()
    styles = getSampleStyleSheet()
    table = Table(
        [["Region", "Units", "Revenue"], ["North", "120", "4,800"], ["South", "95", "3,610"]]
    )
    table.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.5, colors.black)]))
    story = [Paragraph("Sales by region in the spring quarter.", styles["Normal"]), table]
    SimpleDocTemplate(buffer).build(story)
    return buffer.getvalue()


def test_a_ruled_table_becomes_a_table_element_with_its_header():
    report = parse_with_report(_table_pdf(), PDF)
    tables = [e for e in report.elements if e.type == "table"]
    assert len(tables) == 1
    assert tables[0].metadata == {
        "header": ["Region", "Units", "Revenue"],
        "rows": [["North", "120", "4,800"], ["South", "95", "3,610"]],
    }
    assert tables[0].text.split("\n")[2:] == ["| North | 120 | 4,800 |", "| South | 95 | 3,610 |"]
    assert tables[0].page_number == 1
    paragraphs = [e.text for e in report.elements if e.type == "paragraph"]
    assert paragraphs == ["Sales by region in the spring quarter."]  # cells not repeated


def _booktabs_pdf() -> bytes:
    """A journal-style table: rules above and below the header and below the body only."""
    buffer = io.BytesIO()
    styles = getSampleStyleSheet()
    table = Table(
        [["Alloy", "Hardness", "Yield"], ["Brass", "110", "200"], ["Bronze", "160", "340"]]
    )
    table.setStyle(
        TableStyle(
            [
                ("LINEABOVE", (0, 0), (-1, 0), 1, colors.black),
                ("LINEBELOW", (0, 0), (-1, 0), 0.5, colors.black),
                ("LINEBELOW", (0, -1), (-1, -1), 1, colors.black),
            ]
        )
    )
    story = [Paragraph("Table 2: copper alloys compared.", styles["Normal"]), table]
    SimpleDocTemplate(buffer).build(story)
    return buffer.getvalue()


def _prose_between_rules_pdf() -> bytes:
    """Prose between three full-width page rules: not a table."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    for y in (740, 700, 420):
        pdf.line(60, y, 552, y)
    pdf.drawString(72, 720, "Customer service handbook, chapter two")
    lines = [
        "Warranty claims for broken screens are handled within fourteen days of the",
        "request. The service desk records each claim, checks the serial number and",
        "orders the part from the regional warehouse before calling the customer back.",
    ]
    for index, line in enumerate(lines):
        pdf.drawString(72, 680 - 14 * index, line)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def test_a_table_ruled_by_horizontal_lines_only_keeps_its_header():
    report = parse_with_report(_booktabs_pdf(), PDF)
    tables = [e for e in report.elements if e.type == "table"]
    assert [t.metadata for t in tables] == [
        {
            "header": ["Alloy", "Hardness", "Yield"],
            "rows": [["Brass", "110", "200"], ["Bronze", "160", "340"]],
        }
    ]
    paragraphs = [e.text for e in report.elements if e.type == "paragraph"]
    assert paragraphs == ["Table 2: copper alloys compared."]


def test_prose_between_page_rules_is_not_a_table():
    report = parse_with_report(_prose_between_rules_pdf(), PDF)
    assert [e.type for e in report.elements] == ["paragraph"]
    assert "orders the part from the regional warehouse" in report.elements[0].text


# --- image documents ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "TIFF", "BMP", "WEBP", "GIF"])
def test_image_documents_are_ocrd(fmt):
    require_ocr()
    report = parse_image(png_bytes(text_image("RECEIPT 0815"), fmt))
    assert (report.page_count, report.ocr_pages, report.parser) == (1, [1], "tesseract")
    assert [(e.text, e.page_number, e.metadata) for e in report.elements] == [
        ("RECEIPT 0815", 1, {"ocr": True})
    ]


def test_a_huge_image_is_downscaled_within_the_pixel_budget_and_still_read(settings):
    require_ocr()
    settings.KNOWLEDGE_PDF_RASTERIZER_MAX_PIXELS = 1_000_000
    image = text_image("SCALED 2048", size=(2800, 720), font_size=240)  # 2.0 M pixels
    report = parse_image(png_bytes(image))
    assert [e.text for e in report.elements] == ["SCALED 2048"]


def test_a_broken_image_is_corrupt_image():
    with pytest.raises(ParseError) as exc:
        parse_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    assert (exc.value.code, exc.value.message) == ("corrupt_image", "corrupt or unreadable image")


# --- sample documents ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_sample_embedded_images_tables_pdf_is_published_with_text_table_and_figure(space):
    require_ocr()
    data = shared_path("data", "sample-docs", "embedded-images-tables.pdf").read_bytes()
    document = _compile(space, data, "embedded-images-tables.pdf")
    assert document.state == "published", document.error_message
    text = " ".join(KnowledgeNode.objects.values_list("text", flat=True))
    assert "Langmuir" in text and "stainless steel" in text
    assert "0.0335" in text and "24.0910" in text  # cells of the polarization table
    tables = [e for e in _artifact(document).elements if e["type"] == "table"]
    assert len(tables) == 1
    header = tables[0]["metadata"]["header"]
    assert header[0] == "Inhibitor concentration(g)"
    assert header[5:] == ["Polarization resistance(Ω)", "Corrosion rate(mm/year)"]
    assert tables[0]["metadata"]["rows"][0][:3] == ["0", "0.0335", "0.0409"]
    assert (
        "| Polarization resistance(Ω) |" in tables[0]["text"] and "| 24.0910 |" in tables[0]["text"]
    )
    assert "Potentiodynamic polarization data for stainless steel" in text  # the caption
    hits = retrieve(space, "Langmuir adsorption isotherm", top_k=3).items
    assert hits and hits[0].citation["page_number"] == 1
    figures = [a for a in _artifact(document).assets if a["kind"] == "page_image"]
    assert len(figures) == 1 and figures[0]["page_number"] == 1
    assert storage.object_storage().exists(figures[0]["key"])


@pytest.mark.django_db
def test_sample_loremipsum_flat_scan_is_ocrd_and_searchable(space):
    require_ocr()
    data = shared_path("data", "sample-docs", "loremipsum-flat.pdf").read_bytes()
    document = _compile(space, data, "loremipsum-flat.pdf")
    assert document.state == "published", document.error_message
    text = " ".join(KnowledgeNode.objects.values_list("text", flat=True))
    assert "Lorem ipsum dolor sit amet, consectetur adipiscing elit." in text
    assert "sollicitudin" in text
    hits = retrieve(space, "Lorem ipsum dolor sit amet", top_k=3).items
    assert hits and hits[0].citation["page_number"] == 1


def _sleeping_tesseract(directory, marker: str):
    """A ``tesseract`` that never returns; its child ``sleep <marker>`` holds the pipe too."""
    stub = directory / "tesseract"
    stub.write_text(f"#!/bin/sh\nsleep {marker} &\nsleep {marker}\n")
    stub.chmod(0o755)
    return stub


@pytest.fixture
def tesseract_on_path(tmp_path):
    """A stub first on PATH, seen by the parser child too: the parser forkserver keeps the
    environment it started with, so it is started anew with the stub and again after."""
    import os

    from ingestion.parsing import isolation

    saved = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{saved}"
    isolation._forget_server()
    try:
        yield tmp_path
    finally:
        os.environ["PATH"] = saved
        isolation._forget_server()


@pytest.mark.django_db
def test_an_ocr_timeout_fails_the_document_retryably_and_kills_tesseracts_children(
    space, settings, tesseract_on_path
):
    from knowledgefs.testing.isolation_targets import lane_marker
    from knowledgefs.testing.pdf_fixtures import processes_with, wait_gone

    require_ocr()
    marker = lane_marker(988_000_000)  # not another test pass's tesseract
    _sleeping_tesseract(tesseract_on_path, marker)
    # One budget serves pdftoppm and tesseract: 3 s leaves pdftoppm room on a loaded machine
    # (1 s was exceeded by the rasterizer itself there), while this tesseract never ends.
    settings.KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS = 3000
    settings.KNOWLEDGE_JOB_MAX_ATTEMPTS = 1
    with pytest.raises(ParseError) as exc:
        parse_with_report(bc14_pdf(), "application/pdf")
    assert (exc.value.code, exc.value.message) == ("ocr_timeout", "OCR timed out after 3 s")
    assert wait_gone(processes_with(f"sleep\x00{marker}")) == []
    admission = admit_document(space, filename="bc14.pdf", data=bc14_pdf(), enqueue=False)
    run_job(admission.job.id)
    document = Document.objects.get(id=admission.document.id)
    assert (document.state, document.error_code) == ("failed", "ocr_timeout")
    assert document.node_count == 0  # never published with page 2 missing
    assert "ocr_timeout" in RETRYABLE_PARSE_CODES
    assert wait_gone(processes_with(f"sleep\x00{marker}")) == []


@pytest.fixture
def no_tesseract(tmp_path, monkeypatch):
    """A PATH with pdftoppm but no tesseract (a server without OCR), in this process."""
    import os
    import shutil

    require_ocr()
    os.symlink(shutil.which("pdftoppm"), tmp_path / "pdftoppm")
    monkeypatch.setenv("PATH", str(tmp_path))


def test_a_scan_on_a_server_without_tesseract_fails_ocr_unavailable(no_tesseract):
    from knowledgefs.testing.pdf_fixtures import text_image

    with pytest.raises(ParseError) as exc:
        parse_with_report(png_bytes(text_image("INVOICE 4711")), "image/png")
    assert exc.value.code == "ocr_unavailable"
    assert "OCR is unavailable (tesseract not installed)" in exc.value.message
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    pdf.drawImage(ImageReader(io.BytesIO(png_bytes(text_image("INVOICE 4711")))), 72, 500, 468, 120)
    pdf.showPage()
    pdf.save()
    with pytest.raises(ParseError) as exc:
        parse_with_report(buffer.getvalue(), "application/pdf")
    assert (exc.value.code, exc.value.message) == (
        "ocr_unavailable",
        "the document contains no extractable text: OCR is unavailable (tesseract not "
        "installed) for its pages without a text layer (page 1)",
    )
    # a page with a text layer still publishes; the scanned page is reported as before
    report = parse_with_report(bc14_pdf(), "application/pdf")
    assert report.pages_without_text == [2]


def test_a_pdf_with_no_pages_says_so():
    from pypdf import PdfWriter

    out = io.BytesIO()
    PdfWriter().write(out)
    with pytest.raises(ParseError) as exc:
        parse_with_report(out.getvalue(), "application/pdf")
    assert (exc.value.code, exc.value.message) == ("no_extractable_text", "the PDF has no pages")


@pytest.mark.django_db
def test_start_up_warns_about_ocr_languages_that_are_not_installed(settings):
    from knowledgefs.checks import check_pdf_tools

    require_ocr()
    settings.KNOWLEDGE_OCR_LANGUAGES = "eng+xqz"
    found = [p for p in check_pdf_tools() if p.id == "knowledgefs.W103"]
    assert len(found) == 1
    assert "not installed: xqz;" in found[0].msg
    settings.KNOWLEDGE_OCR_LANGUAGES = "eng"
    assert [p.id for p in check_pdf_tools() if p.id == "knowledgefs.W103"] == []
