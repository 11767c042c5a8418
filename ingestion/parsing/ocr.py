"""OCR with Debian's ``tesseract-ocr`` (a bounded subprocess): scanned PDF pages and image files.

Pure Python (no Django). Tesseract runs once per page with the per-operation limit of the
rasterizer (seed: 30 s, :class:`~ingestion.parsing.rasterize.RasterConfig`), through the same
bounded runner as ``pdftoppm`` (own process group, killed and reaped on expiry), and one OpenMP
thread (``OMP_THREAD_LIMIT=1``), so each page costs one core at most. A timeout fails the
document with the retryable ``ocr_timeout``. When Tesseract is not
installed, a page is reported as having no text layer, never silently empty.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import warnings

from PIL import Image, UnidentifiedImageError

from . import rasterize
from .base import Element, ParseReport, clean_text
from .errors import CorruptDocument, ParseError
from .text_parser import split_paragraphs

#: Pillow formats accepted as image documents (HEIF: HEIC/HEIF photos through pillow-heif).
IMAGE_FORMATS = frozenset({"PNG", "JPEG", "TIFF", "GIF", "BMP", "WEBP", "HEIF"})


def _register_heif() -> bool:
    """Register pillow-heif's opener with Pillow (HEIC and HEIF); False when not installed."""
    try:
        from pillow_heif import register_heif_opener
    except ImportError:
        return False
    register_heif_opener()
    return True


HEIF_AVAILABLE = _register_heif()


class OcrUnavailable(Exception):
    """Tesseract is not installed (or OCR is off); the caller reports a missing text layer."""


class OcrFailed(Exception):
    """Tesseract failed on one image; ``reason`` is client-safe."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OcrTimeout(ParseError):
    """``ocr_timeout``: a Tesseract run exceeded the per-operation limit (seed: 30 s); its
    process group was killed and reaped. Fails the whole document (never published with the
    page missing); retryable by the job policy, like ``rasterization_timeout``."""

    code = "ocr_timeout"


class ImageTooLarge(ParseError):
    """An image document over Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``)."""

    code = "image_too_large"


def tesseract_available() -> bool:
    """True when a ``tesseract`` executable is on ``PATH``."""
    return shutil.which("tesseract") is not None


def ocr_image(image: Image.Image, config: rasterize.RasterConfig | None = None) -> str:
    """Recognise the text of ``image``; returns it LF-normalised (may be empty).

    Tesseract runs through :func:`~ingestion.parsing.rasterize.run_bounded`: in a process
    group of its own, killed with everything it started and reaped when it runs past
    ``config.timeout_s``. Its input and output files live in a private temporary directory
    (inside the parse's own directory in the parser child), removed afterwards.

    Raises:
        OcrUnavailable: Tesseract is not installed.
        OcrTimeout: ``ocr_timeout``, "OCR timed out after 30 s".
        OcrFailed: Tesseract could not start, exited with an error or wrote no text file.
    """
    config = config or rasterize.current()
    command = shutil.which("tesseract")
    if command is None:
        raise OcrUnavailable("tesseract is not installed")
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    with tempfile.TemporaryDirectory(prefix="kfs-ocr-") as tmp:
        source, out = os.path.join(tmp, "page.png"), os.path.join(tmp, "text")
        image.save(source, format="PNG")
        args = [command, source, out, "-l", config.ocr_languages]
        try:
            rasterize.run_bounded(
                args, config.timeout_s, what="tesseract", timeout_error=OcrTimeout, label="OCR"
            )
        except rasterize.RasterizationError as exc:
            raise OcrFailed("OCR failed") from exc
        try:
            with open(out + ".txt", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError as exc:
            raise OcrFailed("OCR failed (no output)") from exc
    return clean_text(text)


def ocr_paragraphs(text: str, page_number: int | None) -> list[Element]:
    """Paragraph elements of OCR output, marked ``metadata={"ocr": True}``."""
    return [
        Element(type="paragraph", text=p, page_number=page_number, metadata={"ocr": True})
        for p in split_paragraphs(text)
    ]


def _open_image(data: bytes) -> Image.Image:
    """Open and decode the first frame within Pillow's default decompression-bomb limit."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in IMAGE_FORMATS:
                raise CorruptDocument(f"unsupported image format {image.format or 'unknown'}")
            image.seek(0)
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(
            f"image is larger than {Image.MAX_IMAGE_PIXELS} pixels (decompression-bomb limit)"
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise CorruptDocument("corrupt or unreadable image", code="corrupt_image") from exc
    return image


def parse_image(data: bytes) -> ParseReport:
    """OCR an image document (PNG, JPEG, TIFF, GIF, BMP, WebP, HEIC/HEIF; the first frame or
    the primary image only).

    Pillow opens it within its default ``MAX_IMAGE_PIXELS`` (never raised here); an image over
    the rasterizer's pixel budget (:data:`~ingestion.parsing.rasterize.DEFAULT_MAX_PIXELS`) is
    downscaled to fit before OCR. Returns a report with ``page_count=1``, paragraph elements on
    page 1 marked ``{"ocr": True}`` and ``ocr_pages=[1]``; when Tesseract fails or finds nothing,
    no elements, ``pages_without_text=[1]`` and a warning (compilation then fails).

    Raises :class:`ParseError` subclasses (codes: docs/api.md): over Pillow's
    decompression-bomb limit, not a decodable image, Tesseract past its limit (retryable), or
    Tesseract not installed.
    """
    config = rasterize.current()
    image = _open_image(data)
    pixels = image.width * image.height
    if pixels > config.max_pixels:
        image = rasterize.scaled(image, (config.max_pixels / pixels) ** 0.5)
    try:
        text = ocr_image(image, config)
    except OcrUnavailable as exc:
        raise ParseError(
            "the image cannot be read: OCR is unavailable (tesseract not installed)",
            code="ocr_unavailable",
        ) from exc
    except OcrFailed as exc:
        return _no_text(f"page 1: no text layer ({exc.reason})")
    elements = ocr_paragraphs(text, 1)
    if not elements:
        return _no_text("page 1: no text layer (OCR found no text)")
    return ParseReport(
        elements=elements, page_count=1, pages_without_text=[], parser="tesseract", ocr_pages=[1]
    )


def _no_text(warning: str) -> ParseReport:
    return ParseReport(
        elements=[], page_count=1, pages_without_text=[1], parser="tesseract", warnings=[warning]
    )
