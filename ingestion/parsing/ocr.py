"""OCR with Debian's ``tesseract-ocr`` (a bounded subprocess): scanned PDF pages and image files.

Pure Python (no Django). Tesseract runs once per page with the per-operation limit of the
rasterizer (seed: 30 s, :class:`~ingestion.parsing.rasterize.RasterConfig`), through the same
bounded runner as ``pdftoppm`` (own process group, killed and reaped on expiry), and one OpenMP
thread (``OMP_THREAD_LIMIT=1``), so each page costs one core at most. A timeout fails the
document with the retryable ``ocr_timeout``. When Tesseract is not
installed, a page is reported as having no text layer, never silently empty.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from . import ocr_scripts, rasterize
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

    code = "ocr_failed"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OcrLanguageUnavailable(OcrFailed):
    """``ocr_language_unavailable``: the page is in a script none of the installed language
    data reads (e.g. Korean with only ``eng``); its text is not indexed."""

    code = "ocr_language_unavailable"


class OcrLowConfidence(OcrFailed):
    """``ocr_low_confidence``: Tesseract's best reading has a mean word confidence below
    :data:`MIN_CONFIDENCE`; its text (likely garbage) is not indexed."""

    code = "ocr_low_confidence"


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


#: Mean word confidence (Tesseract's 0-100, weighted by word length) from which a reading in
#: the configured languages is taken without asking OSD for the script (our choice: printed
#: English scores 85-97, Latin-language data on Chinese or Korean text 10-40).
SURE_CONFIDENCE = 75.0
#: Below this mean word confidence a page's best reading is ``ocr_low_confidence`` and is not
#: indexed (our choice, same measurements).
MIN_CONFIDENCE = 60.0
# Tesseract separates Chinese and Japanese characters by spaces; they are joined again.
_CJK = r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]"
_CJK_GAP = re.compile(rf"(?<={_CJK}) (?={_CJK})")


@dataclass(frozen=True)
class _Reading:
    """One Tesseract run: its text, mean word confidence and a score (confident characters)."""

    text: str
    confidence: float
    score: float
    languages: str


def ocr_image(image: Image.Image, config: rasterize.RasterConfig | None = None) -> str:
    """Recognise the text of ``image``; returns it LF-normalised (may be empty).

    Tesseract first reads the image in the configured languages (``config.ocr_languages``).
    A reading with a mean word confidence of :data:`SURE_CONFIDENCE` or more is returned as
    it is. Otherwise OSD (``--psm 0``) names the script; when no configured language writes
    it, the installed language data for that script is used (e.g. ``kor+eng``, then the
    script's other languages such as ``chi_tra``; page segmentation modes 3 and 4) and the most
    confident reading wins. A reading under :data:`MIN_CONFIDENCE` is not returned.

    Every run goes through :func:`~ingestion.parsing.rasterize.run_bounded`: in a process
    group of its own, killed with everything it started and reaped when it runs past
    ``config.timeout_s``. Its input and output files live in a private temporary directory
    (inside the parse's own directory in the parser child), removed afterwards.

    Raises:
        OcrUnavailable: Tesseract is not installed.
        OcrTimeout: ``ocr_timeout``, "OCR timed out after 30 s".
        OcrLanguageUnavailable: the script's language data is not installed.
        OcrLowConfidence: no reading reached :data:`MIN_CONFIDENCE`.
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
        source = os.path.join(tmp, "page.png")
        image.save(source, format="PNG")
        best = _read(command, source, tmp, config.ocr_languages, config)
        if best.confidence >= SURE_CONFIDENCE:
            return best.text
        installed = ocr_scripts.installed_languages(command)
        script = _osd(command, source, config) if "osd" in installed else None
        choice = ocr_scripts.choose(script, config.ocr_languages, installed)
        name = ocr_scripts.script_name(script)
        if not choice.languages:
            wanted = "+".join(choice.wanted) or "none known"
            raise OcrLanguageUnavailable(
                f"the text is in {name} script and no Tesseract language data for it is "
                f"installed (wanted: {wanted}; configured: {config.ocr_languages})"
            )
        if choice.languages != config.ocr_languages:
            for languages in [choice.languages, *ocr_scripts.alternatives(choice, installed)]:
                for psm in ("3", "4"):
                    reading = _read(command, source, tmp, languages, config, psm=psm)
                    best = max(best, reading, key=lambda r: r.score)
                if best.confidence >= SURE_CONFIDENCE:
                    break
    if not best.text.strip():
        return ""
    if best.confidence < MIN_CONFIDENCE:
        raise OcrLowConfidence(
            f"mean word confidence {best.confidence:.0f} is below "
            f"{MIN_CONFIDENCE:.0f} (script {name}, languages {best.languages})"
        )
    return best.text


def _read(command, source, tmp, languages, config, *, psm: str = "3") -> _Reading:
    """One Tesseract run writing text and TSV (word confidences)."""
    out = os.path.join(tmp, f"text-{languages}-{psm}")
    args = [command, source, out, "-l", languages, "--psm", psm, "txt", "tsv"]
    _run(args, config)
    try:
        with open(out + ".txt", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        with open(out + ".tsv", encoding="utf-8", errors="replace") as handle:
            rows = [line.split("\t") for line in handle.read().splitlines()[1:]]
    except OSError as exc:
        raise OcrFailed("OCR failed (no output)") from exc
    words = []
    for row in rows:
        if len(row) == 12 and row[11].strip():
            with contextlib.suppress(ValueError):
                if float(row[10]) >= 0:
                    words.append((float(row[10]), len(row[11].strip())))
    chars = sum(length for _, length in words)
    confidence = sum(c * length for c, length in words) / chars if chars else 0.0
    score = sum(c * length for c, length in words) / 100.0
    return _Reading(_CJK_GAP.sub("", clean_text(text)), confidence, score, languages)


def _osd(command: str, source: str, config) -> str | None:
    """The script Tesseract's orientation and script detection finds, or ``None`` (too little
    text, or OSD failed)."""
    out = os.path.join(os.path.dirname(source), "script")
    try:
        _run([command, source, out, "--psm", "0", "-l", "osd"], config)
        with open(out + ".osd", encoding="utf-8", errors="replace") as handle:
            return ocr_scripts.parse_osd(handle.read())
    except (OcrFailed, OSError):
        return None


def _run(args: list[str], config) -> None:
    try:
        rasterize.run_bounded(
            args, config.timeout_s, what="tesseract", timeout_error=OcrTimeout, label="OCR"
        )
    except rasterize.RasterizationError as exc:
        raise OcrFailed("OCR failed") from exc


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
    decompression-bomb limit, not a decodable image, Tesseract past its limit (retryable),
    Tesseract not installed, the image's script without installed language data
    (``ocr_language_unavailable``) or its best reading not confident (``ocr_low_confidence``).
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
    except (OcrLanguageUnavailable, OcrLowConfidence) as exc:
        raise ParseError(f"the image's text was not indexed: {exc.reason}", code=exc.code) from exc
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
