"""The parser's time budget leaves out the wait for a PDF rasterizer slot: a document queued
behind others for a page-batch slot is not timed out before it ran; the wait has its own bound
(``rasterizer_busy``, retryable).

Real processes: another process holds the machine's only slot (an ``flock`` on the slot file, as
a parser rendering a page does) while a real isolated parser child waits for it.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest
from PIL import Image
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from ingestion.compilation.parse_step import RETRYABLE_PARSE_CODES
from ingestion.parsing import ParseError, rasterize
from ingestion.parsing.isolation import IsolationConfig, parse_isolated
from knowledgefs.testing.pdf_fixtures import png_bytes, require_ocr

PDF = "application/pdf"


def _page_with_picture() -> bytes:
    """One page with a text line and a picture: rendering it (for the page image) takes a slot."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    pdf.drawString(72, 720, "Quarterly figures beside the picture.")
    picture = ImageReader(io.BytesIO(png_bytes(Image.new("RGB", (64, 64), "navy"))))
    pdf.drawImage(picture, 72, 300, 300, 300)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_slot(lock_dir, seconds: float) -> subprocess.Popen:
    """Another process takes slot 0 of ``lock_dir`` for ``seconds``."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock_dir / "slot-0.lock"), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_parse_queued_for_a_slot_longer_than_its_budget_still_runs(tmp_path):
    require_ocr()
    raster = rasterize.RasterConfig(max_concurrency=1, lock_dir=str(tmp_path), slot_wait_s=60)
    holder = _hold_slot(tmp_path, 6.0)
    try:
        started = time.monotonic()
        report = parse_isolated(
            _page_with_picture(), PDF, config=IsolationConfig(timeout_s=4.0), raster=raster
        )
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    # Before: ParserTimeout at 4 s, the page never rendered. Now the 6 s in the queue are not
    # counted and the parse completes with its page image.
    assert elapsed >= 5.0, elapsed
    assert [e.text for e in report.elements] == ["Quarterly figures beside the picture."]
    assert [a.kind for a in report.assets] == ["page_image", "thumbnail"]


def test_a_wait_over_its_own_bound_is_rasterizer_busy_and_retryable(tmp_path):
    require_ocr()
    raster = rasterize.RasterConfig(max_concurrency=1, lock_dir=str(tmp_path), slot_wait_s=2)
    holder = _hold_slot(tmp_path, 30.0)
    try:
        started = time.monotonic()
        with pytest.raises(ParseError) as raised:
            parse_isolated(
                _page_with_picture(), PDF, config=IsolationConfig(timeout_s=60), raster=raster
            )
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert raised.value.code == "rasterizer_busy"
    assert raised.value.message == (
        "no PDF rasterizer slot became free within 2 s "
        "(1 concurrent page batches per machine are busy)"
    )
    assert "rasterizer_busy" in RETRYABLE_PARSE_CODES
    assert 2.0 <= elapsed < 30.0, elapsed


def test_the_parse_itself_is_still_bounded_after_a_wait(tmp_path):
    """The budget still applies to the parse's own running time."""
    from ingestion.parsing.isolation import ParserTimeout

    with pytest.raises(ParserTimeout) as raised:
        parse_isolated(
            b"x",
            "text/plain",
            config=IsolationConfig(timeout_s=2.0),
            target="knowledgefs.testing.isolation_targets:spin_forever",
        )
    assert "exceeded its limit of 2 s" in str(raised.value)
