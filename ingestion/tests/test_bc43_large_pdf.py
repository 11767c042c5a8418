"""BC-43: long PDFs parse with a flat memory peak under a 1.5 GB cap, the 500-asset cap is
reported, and documents over the page or OCR limits fail up front with nothing written.

Real parser children (``RLIMIT_AS`` of 1.5 GiB, their peak resident set read from
``/proc/self/status``), real ``pdftoppm``; PDFs built with reportlab. To stay within about a
minute the flatness is measured at two sizes instead of the case's 1,200 pages.
"""

from __future__ import annotations

import io
import time

import pytest
from PIL import Image
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from ingestion.compilation.pipeline import run_job
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact
from ingestion.parsing import rasterize
from ingestion.parsing.isolation import IsolationConfig, parse_isolated
from knowledgefs.testing.pdf_fixtures import png_bytes, require_ocr

PDF = "application/pdf"
CAP = 1536 * 1024 * 1024  # the case's 1.5 GB worker


def _long_pdf(pages: int, *, text: bool = True) -> bytes:
    """``pages`` pages: one line of text and a small drawn image each (``text=False``: an
    image over the whole page and no text layer, a scan)."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    picture = ImageReader(io.BytesIO(png_bytes(Image.new("RGB", (64, 64), "navy"))))
    for number in range(1, pages + 1):
        if text:
            pdf.drawString(72, 720, f"Page {number} of the long ledger, one line of text.")
            pdf.drawImage(picture, 72, 600, 48, 48)
        else:
            pdf.drawImage(picture, 0, 0, 612, 792)
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def _parse(data: bytes, raster: rasterize.RasterConfig):
    report = parse_isolated(
        data, PDF, config=IsolationConfig(timeout_s=240, memory_bytes=CAP), raster=raster,
        target="knowledgefs.testing.isolation_targets:parse_measuring_memory",
    )  # fmt: skip
    peak = int(report.warnings.pop().removeprefix("peak_rss_kib="))
    return report, peak // 1024


@pytest.mark.timeout(240)
def test_bc43_peak_memory_is_flat_in_page_count_and_the_asset_cap_is_reported(tmp_path):
    require_ocr()
    raster = rasterize.RasterConfig(max_assets=40, lock_dir=str(tmp_path))
    small, small_peak = _parse(_long_pdf(60), raster)
    large, large_peak = _parse(_long_pdf(300), raster)
    for report, pages in ((small, 60), (large, 300)):
        assert report.page_count == pages
        assert [e.page_number for e in report.elements] == list(range(1, pages + 1))
        assert len(report.assets) == 40  # 20 pages of page image + thumbnail, then the cap
        assert report.warnings == ["page images limited to 40 per document; later ones skipped"]
    # Five times the pages, about the same peak: pages are parsed and released one by one.
    assert large_peak - small_peak < 40, (small_peak, large_peak)
    assert large_peak < 400, large_peak


@pytest.mark.django_db
@pytest.mark.timeout(120)
def test_bc43_a_600_page_scan_fails_up_front_over_the_ocr_limit(space, settings):
    settings.KNOWLEDGE_PARSER_MAX_MEMORY_MB = 1536
    data = _long_pdf(600, text=False)
    admission = admit_document(space, filename="scan-600.pdf", data=data, enqueue=False)
    started = time.monotonic()
    run_job(admission.job.id)
    elapsed = time.monotonic() - started
    document = Document.objects.get(id=admission.document.id)
    assert (document.state, document.error_code) == ("failed", "document_too_large")
    assert document.error_message == (
        "the document exceeds 200 pages to OCR (600 pages without a text layer); split it"
    )
    job = CompilationJob.objects.get(id=admission.job.id)
    assert (job.run_state, job.error_retryable) == ("failed", False)
    assert not KnowledgeNode.objects.filter(document=document).exists()
    assert not ParseArtifact.objects.filter(document=document).exists()
    assert elapsed < 60, elapsed  # refused before a page was rendered


@pytest.mark.django_db
@pytest.mark.timeout(180)
def test_bc43_a_1200_page_pdf_over_the_page_limit_fails_up_front(space, settings):
    settings.KNOWLEDGE_PDF_MAX_PAGES = 1000
    admission = admit_document(space, filename="ledger.pdf", data=_long_pdf(1200), enqueue=False)
    run_job(admission.job.id)
    document = Document.objects.get(id=admission.document.id)
    assert (document.state, document.error_code) == ("failed", "document_too_large")
    assert document.error_message == "the document exceeds 1000 pages (1200 pages); split it"
    assert not KnowledgeNode.objects.filter(document=document).exists()


def _text_pdf(pages: int) -> bytes:
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    for number in range(1, pages + 1):
        pdf.drawString(72, 720, f"Page {number} of the long ledger, one line of text.")
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


@pytest.mark.timeout(240)
def test_bc43_the_parser_child_reports_pages_parsed_by_range(tmp_path):
    seen: list[tuple[int, int]] = []
    report = parse_isolated(
        _text_pdf(400), PDF, config=IsolationConfig(timeout_s=200, memory_bytes=CAP),
        raster=rasterize.RasterConfig(lock_dir=str(tmp_path)), on_pages=lambda *p: seen.append(p),
    )  # fmt: skip
    assert report.page_count == 400
    assert seen, "no page progress reported"
    assert seen[-1] == (400, 400)
    assert [done for done, _ in seen] == sorted({done for done, _ in seen})  # only forward
    assert {total for _, total in seen} == {400}


@pytest.mark.django_db
@pytest.mark.timeout(240)
def test_bc43_a_parsing_job_shows_its_pages_in_the_job_api_and_admin(space, client, settings):
    from ingestion.admin import progress_counters, progress_label
    from ingestion.compilation.leases import Held, claim
    from ingestion.compilation.parse_step import _parse

    admission = admit_document(space, filename="ledger.pdf", data=_text_pdf(120), enqueue=False)
    token = claim(admission.job.id, "worker-1")
    job = CompilationJob.objects.select_related("document").get(id=admission.job.id)
    artifact = _parse(job, Held({job.id: token}))  # the parse step, before its checkpoint
    assert artifact.page_count == 120
    body = client.get(f"/v1/jobs/{job.id}").json()
    progress = body["progress"]
    assert (progress["pages_parsed"], progress["pages_total"]) == (120, 120), progress
    assert progress["phase"] == "parsing" and progress["operation"].endswith("of 120")
    assert progress["operation"].startswith("parsed page")
    assert 0 < progress["percent"] < 30 and body["progress_percent"] == progress["percent"]
    job.refresh_from_db()
    assert ("pages parsed", "120 of 120") in progress_counters(job)
    assert progress_label(job).endswith("parsing page 120/120")
