"""PDFs and images built for the PDF, rasterization and isolation tests (reportlab, Pillow, pypdf).

:func:`require_ocr` skips a test when Debian's ``pdftoppm`` or ``tesseract`` is missing, unless
``KFS_REQUIRE_OCR=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas


def require_ocr() -> None:
    """Skip (or, with ``KFS_REQUIRE_OCR=1``, fail) unless pdftoppm and tesseract are installed."""
    missing = [name for name in ("pdftoppm", "tesseract") if shutil.which(name) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed (Debian poppler-utils / tesseract-ocr; make ocr)"
    if os.environ.get("KFS_REQUIRE_OCR") == "1":
        pytest.fail(message)
    pytest.skip(message)


def text_image(text: str, size: tuple[int, int] = (1400, 360), font_size: int = 120) -> Image.Image:
    """A white RGB image with ``text`` drawn in black by Pillow (a "scan" without text layer)."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.text((40, 100), text, fill="black", font=ImageFont.load_default(size=font_size))
    return image


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def text_pdf(pages: list[list[str]], pagesize: tuple[float, float] = (612, 792)) -> bytes:
    """One page per entry, each line drawn as text (a real text layer)."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=pagesize)
    for lines in pages:
        y = pagesize[1] - 72
        for line in lines:
            pdf.drawString(72, y, line)
            y -= 18
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def bc14_pdf() -> bytes:
    """BC-14: page 1 normal text; page 2 only a PNG with Pillow-drawn "INVOICE 4711"."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    pdf.drawString(72, 700, "Quarterly statement for the northern warehouse.")
    pdf.drawString(72, 680, "The attached invoice lists every delivery of the quarter.")
    pdf.showPage()
    pdf.drawImage(ImageReader(io.BytesIO(png_bytes(text_image("INVOICE 4711")))), 72, 500, 468, 120)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def encrypt(data: bytes, *, user: str, owner: str) -> bytes:
    """``data`` encrypted with pypdf (AES-256 needs the cryptography package; RC4 otherwise)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user, owner_password=owner)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def three_page_pdf() -> bytes:
    return text_pdf(
        [
            ["Page one talks about corrosion of stainless steel."],
            ["Page two covers egg shell inhibitors in sulphuric acid."],
            ["Page three summarises the Langmuir isotherm."],
        ]
    )


def bc15_variants() -> dict[str, bytes]:
    """BC-15 (a) last 40% cut, (b) wrong ``startxref`` offset, (c) 77 bytes of garbage."""
    valid = three_page_pdf()
    head, sep, tail = valid.rpartition(b"startxref")
    offset = tail.split()[0]
    wrong = head + sep + tail.replace(offset, str(int(offset) + 9173).encode(), 1)
    garbage = (b"%PDF-1.4\n" + bytes(range(200, 256)) * 2)[:77]
    return {"truncated": valid[: int(len(valid) * 0.6)], "startxref": wrong, "garbage": garbage}


def write_stub(directory: Path, marker: int) -> tuple[Path, Path]:
    """A ``pdftoppm`` that never returns: it records its pid and its child's, then waits on a
    ``sleep <marker>``. Returns ``(stub, pid file)``."""
    pids = directory / "stub-pids"
    stub = directory / "pdftoppm"
    stub.write_text(
        f'#!/bin/sh\necho $$ >> "{pids}"\nsleep {marker} &\necho $! >> "{pids}"\nwait\n'
    )
    stub.chmod(0o755)
    return stub, pids


def live_pids(pid_file: Path) -> list[int]:
    """Pids recorded in ``pid_file`` that still exist in any state (running or zombie)."""
    if not pid_file.exists():
        return []
    alive = []
    for line in pid_file.read_text().split():
        if os.path.exists(f"/proc/{int(line)}"):
            alive.append(int(line))
    return alive


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (zombies have none, see :func:`live_pids`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def wait_gone(pids: list[int], seconds: float = 3.0) -> list[int]:
    """Wait until none of ``pids`` exists; returns those still there."""
    deadline = time.monotonic() + seconds
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.05)
    return pids


def kill_quietly(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
