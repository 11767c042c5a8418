"""Rasterization limits: the pixel budget (a 120-inch page), the per-operation timeout with a
``pdftoppm`` that never returns (BC-16: killed, reaped, retried per the job policy, then failed),
the page-batch slots, and the start-up validation of the settings."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from PIL import Image
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from ingestion.compilation.pipeline import compile_jobs, run_job
from ingestion.compilation.recovery import recover_jobs
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document
from ingestion.parsing import parse_with_report, rasterize
from knowledgefs.testing.pdf_fixtures import (
    bc14_pdf,
    live_pids,
    png_bytes,
    require_ocr,
    wait_gone,
    write_stub,
)

INCH = 72


def test_fit_dpi_keeps_a_120_inch_page_within_the_budget():
    side = 120 * INCH
    dpi = rasterize.fit_dpi(side, side, 144, 25_000_000)
    assert dpi == 41  # sqrt(25e6 / 14400) = 41.67
    assert (120 * dpi) ** 2 <= 25_000_000
    assert rasterize.fit_dpi(612, 792, 144, 25_000_000) == 144  # a letter page is untouched


def test_a_120_inch_page_renders_at_reduced_scale_within_the_pixel_budget(tmp_path):
    require_ocr()
    side = 120 * INCH
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(side, side))
    pdf.drawImage(ImageReader(io.BytesIO(png_bytes(Image.new("RGB", (64, 64), "red")))), 0, 0,
                  side, side)  # fmt: skip
    pdf.showPage()
    pdf.save()
    path = tmp_path / "huge.pdf"
    path.write_bytes(buffer.getvalue())
    config = rasterize.RasterConfig(max_pixels=25_000_000)
    image = rasterize.render_page(
        str(path), 1, width_pt=side, height_pt=side, dpi=144, config=config
    )
    assert image.size == (4920, 4920)  # 41 DPI instead of 144 (17280 x 17280 = 299 M pixels)
    assert image.width * image.height <= config.max_pixels
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's own limit untouched


def test_a_pdftoppm_that_never_returns_is_killed_and_reaped(tmp_path):
    stub, pid_file = write_stub(tmp_path, 987651)
    config = rasterize.RasterConfig(command=str(stub), timeout_s=1.0)
    source = tmp_path / "doc.pdf"
    source.write_bytes(bc14_pdf())
    started = time.monotonic()
    with pytest.raises(rasterize.RasterizationTimeout) as exc:
        rasterize.render_page(str(source), 1, width_pt=612, height_pt=792, dpi=144, config=config)
    elapsed = time.monotonic() - started
    assert exc.value.code == "rasterization_timeout"
    assert exc.value.message == "rasterization timed out after 1 s"
    assert 1.0 <= elapsed < 3.0, elapsed
    # The stub is gone and reaped at once; its `sleep` child was killed with the group (this
    # process is no subreaper, so that orphan is reaped by whoever adopts it; inside the parser
    # sandbox that is the parser process, see the BC-16 test below).
    shell = int(pid_file.read_text().split()[0])
    assert not os.path.exists(f"/proc/{shell}")
    sleeper = int(pid_file.read_text().split()[1])
    assert not _running(sleeper)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.django_db
def test_bc16_a_hanging_pdftoppm_times_out_is_retried_then_fails_and_others_flow(
    space, settings, tmp_path
):
    stub, pid_file = write_stub(tmp_path, 987652)
    settings.KNOWLEDGE_PDF_RASTERIZER_COMMAND = str(stub)
    settings.KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS = 1500
    settings.KNOWLEDGE_JOB_MAX_ATTEMPTS = 2
    bad = admit_document(space, filename="slow.pdf", data=bc14_pdf(), enqueue=False)
    good = admit_document(
        space, filename="ok.txt", data=b"Plain text keeps flowing. " * 20, enqueue=False
    )
    started = time.monotonic()
    compile_jobs([bad.job.id, good.job.id])
    elapsed = time.monotonic() - started
    assert Document.objects.get(id=good.document.id).state == "published"
    job = CompilationJob.objects.get(id=bad.job.id)
    assert (job.run_state, job.error_code, job.error_retryable) == (
        "retry_wait",
        "rasterization_timeout",
        True,
    )
    assert job.error_message == "rasterization timed out after 1.5 s"
    assert elapsed < 15, elapsed
    assert wait_gone(live_pids(pid_file)) == []  # stub and its child: killed and reaped
    # The retry is due: the second and last attempt fails the same way, for good.
    assert recover_jobs(now=job.next_attempt_at + timedelta(seconds=1)).retries_due
    job.refresh_from_db()
    run_job(job.id, job.task_id)
    job.refresh_from_db()
    assert (job.run_state, job.error_code, job.execution_attempts) == (
        "failed",
        "rasterization_timeout",
        2,
    )
    assert job.error_message == "rasterization timed out after 1.5 s (gave up after 2 attempts)"
    document = Document.objects.get(id=bad.document.id)
    assert (document.state, document.error_code) == ("failed", "rasterization_timeout")
    assert wait_gone(live_pids(pid_file)) == []


def test_page_batches_share_the_configured_number_of_slots(tmp_path):
    config = rasterize.RasterConfig(max_concurrency=2, lock_dir=str(tmp_path))
    inside, peak, lock = [0], [0], threading.Lock()

    def batch():
        with rasterize.batch_slot(config):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=batch) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KNOWLEDGE_PDF_RASTERIZER", "ghostscript", "is not one of: poppler, off"),
        ("KNOWLEDGE_PDF_RASTERIZER_MAX_CONCURRENCY", "9", "outside the accepted range 1..8"),
        ("KNOWLEDGE_PDF_RASTERIZER_DPI", "20", "outside the accepted range 36..600"),
        ("KNOWLEDGE_PDF_RASTERIZER_MAX_PIXELS", "100000000", "range 1000000..89478485"),
        ("KNOWLEDGE_PDF_RASTERIZER_COMMAND", "pdftoppm", "absolute path of an executable"),
        ("KNOWLEDGE_PARSER_TIMEOUT_SECONDS", "2000", "less than KNOWLEDGE_JOB_TIMEOUT_SECONDS"),
        ("KNOWLEDGE_OCR_LANGUAGES", "eng;rm", "Tesseract language codes"),
    ],
)
def test_settings_are_validated_at_start_up(name, value, message, tmp_path):
    env = {**os.environ, name: value, "KNOWLEDGE_JOB_TIMEOUT_SECONDS": "1800"}
    env["KNOWLEDGE_VAR_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", "import knowledgefs.settings"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert result.returncode != 0
    assert message in result.stderr and name in result.stderr


def test_start_up_checks_name_missing_tools_and_daemonic_workers(settings, monkeypatch):
    from knowledgefs.checks import check_pdf_tools

    assert check_pdf_tools() == [] or shutil.which("tesseract") is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert [p.id for p in check_pdf_tools()] == ["knowledgefs.W101", "knowledgefs.W102"]
    settings.KNOWLEDGE_PDF_RASTERIZER = "off"
    assert [p.id for p in check_pdf_tools()] == ["knowledgefs.W102"]
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "daemonize_workers": True}
    assert [p.id for p in check_pdf_tools()] == ["knowledgefs.W102", "knowledgefs.E101"]


def _image_pages(count: int, pagesize=(612, 792)) -> bytes:
    """``count`` pages, each only a photo-like image over most of the page (no text layer)."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=pagesize)
    picture = ImageReader(io.BytesIO(png_bytes(Image.new("RGB", (64, 64), "navy"))))
    for _ in range(count):
        pdf.drawImage(picture, 0, 0, pagesize[0], pagesize[1])
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def test_a_120_inch_page_through_the_parser_keeps_its_images_within_the_budget(settings):
    require_ocr()
    side = 120 * INCH
    report = parse_with_report(_image_pages(1, (side, side)), "application/pdf")
    kinds = {a.kind: (a.width, a.height) for a in report.assets}
    assert kinds == {"page_image": (4920, 4920), "thumbnail": (1640, 1640)}
    assert report.pages_without_text == [1]  # OCR read the page and found no text
    assert report.warnings == ["page 1: no text layer (OCR found no text)"]


def test_the_asset_cap_stops_page_images_with_a_warning(settings):
    require_ocr()
    settings.KNOWLEDGE_PDF_RASTERIZER_MAX_ASSETS = 3
    report = parse_with_report(_image_pages(3), "application/pdf")
    assert [(a.kind, a.page_number) for a in report.assets] == [
        ("page_image", 1),
        ("thumbnail", 1),
        ("page_image", 2),
    ]
    assert "page images limited to 3 per document; later ones skipped" in report.warnings


def _scan_in_crop_box_pdf() -> bytes:
    """A 120-inch square MediaBox whose 612 x 792 CropBox (at 1000, 1000) shows a scan of
    "INVOICE 4711" and no text layer."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import RectangleObject

    from knowledgefs.testing.pdf_fixtures import text_image

    side = 120 * INCH
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(side, side))
    pdf.drawImage(ImageReader(io.BytesIO(png_bytes(text_image("INVOICE 4711")))), 1072, 1500,
                  468, 120)  # fmt: skip
    pdf.showPage()
    pdf.save()
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(buffer.getvalue())))
    writer.pages[0].cropbox = RectangleObject([1000, 1000, 1612, 1792])
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_scan_in_a_crop_box_smaller_than_its_media_box_is_ocrd():
    require_ocr()
    report = parse_with_report(_scan_in_crop_box_pdf(), "application/pdf")
    assert report.ocr_pages == [1], report.warnings
    assert "INVOICE 4711" in " ".join(e.text for e in report.elements)


def test_a_rendered_image_of_the_wrong_size_is_a_rasterization_failure(tmp_path):
    """A rasterizer that writes a 1 x 1 image (Poppler's answer to "Bogus memory allocation
    size") does not pass as the page."""
    stub = tmp_path / "tiny"
    stub.write_text(
        '#!/bin/sh\nfor a in "$@"; do last=$a; done\n'
        f"{sys.executable} -c \"from PIL import Image; Image.new('L', (1, 1), 255)"
        f".save('$last.png')\"\n"
    )
    stub.chmod(0o755)
    (tmp_path / "doc.pdf").write_bytes(bc14_pdf())
    config = rasterize.RasterConfig(command=str(stub))
    with pytest.raises(rasterize.RasterizationError) as exc:
        rasterize.render_page(str(tmp_path / "doc.pdf"), 2, width_pt=612, height_pt=792,
                              dpi=144, config=config)  # fmt: skip
    assert exc.value.message == "page 2 rendered to 1x1 pixels instead of 1224x1584"


@pytest.mark.django_db
def test_a_rasterizer_writing_garbage_is_a_page_warning_not_a_corrupt_pdf(
    space, settings, tmp_path
):
    stub = tmp_path / "garbage"
    stub.write_text(
        '#!/bin/sh\nfor a in "$@"; do last=$a; done\nhead -c 5000 /dev/urandom > "$last.png"\n'
    )
    stub.chmod(0o755)
    settings.KNOWLEDGE_PDF_RASTERIZER_COMMAND = str(stub)
    report = parse_with_report(bc14_pdf(), "application/pdf")
    assert report.pages_without_text == [2]
    assert "page 2: no text layer (rendering failed)" in report.warnings
    admission = admit_document(space, filename="bc14.pdf", data=bc14_pdf(), enqueue=False)
    run_job(admission.job.id)
    document = Document.objects.get(id=admission.document.id)
    assert document.error_code != "corrupt_pdf"


def test_a_rotated_page_gets_page_images_and_a_thumbnail_in_its_displayed_orientation():
    require_ocr()
    from pypdf import PdfReader, PdfWriter

    from knowledgefs.testing.pdf_fixtures import text_image

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    pdf.drawString(72, 720, "A rotated page with a figure.")
    pdf.drawImage(ImageReader(io.BytesIO(png_bytes(text_image("INVOICE 4711")))), 72, 500,
                  468, 120)  # fmt: skip
    pdf.showPage()
    pdf.save()
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(buffer.getvalue())))
    writer.pages[0].rotate(90)
    out = io.BytesIO()
    writer.write(out)
    report = parse_with_report(out.getvalue(), "application/pdf")
    sizes = {a.kind: (a.width, a.height) for a in report.assets}
    # the 468 x 120 pt image stands upright on the turned page: 120 x 468 pt at 144 DPI
    assert sizes["page_image"] == (240, 936)
    # the whole turned page (792 x 612 pt) at 48 DPI
    assert sizes["thumbnail"] == (528, 408)
