"""PDF parser: text per page (pypdf), tables (pdfplumber), OCR of image-only pages, page images.

* **Text.** pypdf extracts each page's text layer, split into paragraphs on blank lines. On a
  page where pdfplumber finds tables, the text comes from pdfplumber instead, without the
  characters inside the tables, so a table's cells are not repeated as a paragraph.
* **Layout pass only where needed.** pdfplumber (pdfminer's layout analysis, the costly part)
  runs only on pages whose content stream paints a path, shows an image or form XObject, or
  uses a font without a Unicode mapping (:func:`.pdf_content.needs_layout`, a scan of the
  operators); a page that draws only text takes pypdf's text alone.
* **Unmapped glyphs.** A composite font with an Identity encoding and no ``/ToUnicode`` names
  no characters: pypdf prints its glyph ids as unrelated letters, pdfminer as ``(cid:N)``. Such
  a page's text comes from pdfminer (which maps what the font's encoding or embedded cmap
  allows); a word or table cell holding a ``(cid:N)`` glyph is dropped whole (the lone minus
  of "-0.94" in a math font must not leave "0.94") and counted in a warning ``"page N: K words
  or table cells dropped: they hold glyphs without a Unicode mapping ..."``; never in a chunk.
* **Tables** (:mod:`ingestion.parsing.pdf_tables`). pdfplumber's ``find_tables``: tables
  drawn with a grid of lines, else tables ruled only by full-width horizontal lines (journal
  style: a rule above and below the header and below the body; columns from the text's
  alignment, a multi-line header joined per column); each becomes one ``"table"`` element in
  the shared convention
  (:mod:`ingestion.parsing.tables`): the first row is the header,
  ``metadata={"header": [...], "rows": [[...], ...]}``.
* **OCR.** A page without a text layer is rendered (:mod:`ingestion.parsing.rasterize`, at the
  OCR DPI within the pixel budget) and read by Tesseract (:mod:`ingestion.parsing.ocr`); its
  paragraphs carry ``{"ocr": True}`` and the page is listed in ``ocr_pages``. With the
  rasterizer ``off``, no ``pdftoppm`` or no Tesseract, the page is listed in
  ``pages_without_text`` with a warning ``"page N: no text layer (...)"``.
* **Page images.** A page carrying images (pdfplumber ``page.images``) gets one ``page_image``
  asset per image (the page rendered at the page-image DPI, 144, cropped to the image's box;
  the whole page when the images cover most of it) and one ``thumbnail`` of the page (48 DPI),
  at most ``max_assets`` per document (seed: 500); each asset names the first element of its page.
* **Passwords.** A PDF protected by an owner password only is opened with the empty user
  password; one that needs a user password fails ``encrypted_pdf``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError

from . import ocr, page_progress, pdf_content, pdf_tables, rasterize
from .base import Asset, Element, ParseReport, clean_text
from .errors import CorruptDocument, EncryptedDocument, ParseError
from .text_parser import split_paragraphs

if TYPE_CHECKING:
    import pdfplumber

logger = logging.getLogger("knowledgefs.parsing.pdf")
# pypdf and pdfminer (under pdfplumber) log font-encoding and xref-repair notes per page at
# WARNING; the outcome that matters reaches the report (codes, warnings), so keep them quiet.
logging.getLogger("pdfminer").setLevel(logging.ERROR)
logging.getLogger("pypdf").setLevel(logging.ERROR)

_CORRUPT = "corrupt or unreadable PDF"
_ENCRYPTED = "encrypted PDF, password required"
# Images smaller than this many points on a side (bullets, rules, logos) get no page image.
_MIN_IMAGE_PT = 24.0
# When the page's images cover this share of it, one page image of the whole page is stored.
_FULL_PAGE_SHARE = 0.8


class EncryptedPdf(EncryptedDocument):
    """``encrypted_pdf``: the PDF needs a user password ("encrypted PDF, password required")."""

    code = "encrypted_pdf"

    def __init__(self, message: str = _ENCRYPTED) -> None:
        super().__init__(message)


class DocumentTooLarge(ParseError):
    """``document_too_large``: more pages, or more pages needing OCR, than the configured
    limits; refused before any page is parsed (nothing is half-written)."""

    code = "document_too_large"


class CorruptPdf(CorruptDocument):
    """``corrupt_pdf``: damaged, truncated beyond repair or not a PDF at all."""

    code = "corrupt_pdf"

    def __init__(self, message: str = _CORRUPT) -> None:
        super().__init__(message)


#: Kept for callers of the earlier API: a PDF parse result is now a :class:`ParseReport`.
PdfResult = ParseReport


def _open(data: bytes) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
    except FileNotDecryptedError as exc:
        raise EncryptedPdf() from exc
    except Exception as exc:
        raise CorruptPdf() from exc
    if reader.is_encrypted:
        try:
            result = reader.decrypt("")
        except DependencyError as exc:
            raise EncryptedPdf("encrypted PDF uses an unsupported cipher") from exc
        except Exception as exc:
            raise CorruptPdf() from exc
        if result == PasswordType.NOT_DECRYPTED:
            raise EncryptedPdf()
    return reader


def _open_plumber(data: bytes) -> pdfplumber.PDF | None:
    """A pdfplumber document for tables and images, or ``None`` if pdfminer cannot read it."""
    try:
        import pdfplumber

        return pdfplumber.open(io.BytesIO(data), password="")
    except Exception:  # noqa: BLE001 - tables and images are best effort; text comes from pypdf
        logger.info("pdfplumber could not open the PDF; no tables or page images")
        return None


@dataclass
class _Doc:
    """Per-document state while pages are parsed."""

    data: bytes
    config: rasterize.RasterConfig
    elements: list[Element] = field(default_factory=list)
    assets: list[Asset] = field(default_factory=list)
    ocr_pages: list[int] = field(default_factory=list)
    without_text: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    path: str | None = None
    tmp: tempfile.TemporaryDirectory | None = None
    capped: bool = False
    no_ocr: set[int] = field(default_factory=set)  # pages unread only for want of tesseract
    ocr_codes: dict[int, str] = field(default_factory=dict)  # page -> ocr_language_unavailable...

    def pdf_path(self) -> str:
        """The PDF written to a private temp file once, for ``pdftoppm``."""
        if self.path is None:
            self.tmp = tempfile.TemporaryDirectory(prefix="kfs-pdf-")
            self.path = os.path.join(self.tmp.name, "source.pdf")
            with open(self.path, "wb") as handle:
                handle.write(self.data)
        return self.path

    def close(self) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()


def parse_pdf(data: bytes) -> ParseReport:
    """Parse a PDF into elements, tables, OCR'd text and page images (see the module doc).

    Returns a :class:`ParseReport` (parser ``"pypdf"``) with ``page_count``, the pages without
    a text layer, ``ocr_pages``, ``assets`` and ``warnings``.

    Raises :class:`ParseError` subclasses (codes: docs/api.md): a user password needed, a
    damaged PDF or no readable page, 0 pages, no text at all only because Tesseract is not
    installed, a Tesseract or Poppler run past its per-operation limit (Poppler's seed: 30 s;
    its process group is killed).
    """
    try:
        return _parse_pdf(data)
    except ParseError:
        raise
    except RecursionError as exc:
        raise CorruptPdf(f"{_CORRUPT} (nesting too deep)") from exc
    except Exception as exc:  # noqa: BLE001 - any library failure is a damaged file
        raise CorruptPdf() from exc


def _parse_pdf(data: bytes) -> ParseReport:
    reader = _open(data)
    try:
        pages = list(reader.pages)
    except FileNotDecryptedError as exc:
        raise EncryptedPdf() from exc
    except Exception as exc:
        raise CorruptPdf() from exc
    if not pages:
        raise ParseError("the PDF has no pages", code="no_extractable_text")
    doc = _Doc(data=data, config=rasterize.current())
    operators = _check_size(pages, doc.config)
    # pdfplumber's PDF, opened on the first page that needs a layout pass (False: unreadable)
    plumber: pdfplumber.PDF | Literal[False] | None = None
    failures = 0
    try:
        for number, page in enumerate(pages, start=1):
            ppage = None
            if pdf_content.needs_layout(page, operators[number - 1]):
                if plumber is None:
                    plumber = _open_plumber(data) or False
                ppage = _plumber_page(plumber, number)
            try:
                failures += not _parse_page(doc, number, page, ppage)
            finally:
                if ppage is not None:
                    with contextlib.suppress(Exception):
                        ppage.close()
            page_progress.report(number, len(pages))
    finally:
        doc.close()
        if plumber:
            with contextlib.suppress(Exception):
                plumber.close()
    if failures == len(pages):
        raise CorruptPdf()
    if not doc.elements and doc.without_text and set(doc.without_text) <= doc.no_ocr:
        raise ParseError(
            "the document contains no extractable text: OCR is unavailable (tesseract not "
            f"installed) for its pages without a text layer ({_pages(doc.without_text)})",
            code="ocr_unavailable",
        )
    if not doc.elements and doc.without_text and set(doc.without_text) <= set(doc.ocr_codes):
        codes = sorted(set(doc.ocr_codes.values()))
        raise ParseError(
            f"the document contains no text OCR could read reliably ({', '.join(codes)}): "
            + "; ".join(w for w in doc.warnings if "ocr_" in w)[:900],
            code=codes[0],
        )
    return ParseReport(
        elements=doc.elements,
        page_count=len(pages),
        pages_without_text=doc.without_text,
        parser="pypdf",
        assets=doc.assets,
        ocr_pages=doc.ocr_pages,
        warnings=doc.warnings,
    )


def _pages(numbers: list[int]) -> str:
    """``"pages 1, 2, 3"`` (at most 20 listed) or ``"page 1"``."""
    listed = ", ".join(str(n) for n in numbers[:20]) + (", ..." if len(numbers) > 20 else "")
    return f"page{'s' if len(numbers) > 1 else ''} {listed}"


def _plumber_page(plumber, number: int):
    if not plumber:
        return None
    try:
        return plumber.pages[number - 1]
    except Exception:  # noqa: BLE001
        return None


def _parse_page(doc: _Doc, number: int, page, ppage) -> bool:
    """Add one page's elements and assets to ``doc``; False when its text could not be read.

    ``ppage`` (pdfplumber) is ``None`` on a page that draws no paths or images and has no font
    without a Unicode mapping (:func:`.pdf_content.needs_layout`): its text is pypdf's, with no
    table or image pass.
    """
    ok = True
    try:
        text = page.extract_text() or ""
    except FileNotDecryptedError as exc:
        raise EncryptedPdf() from exc
    except Exception:  # noqa: BLE001 - a damaged page counts as unreadable
        ok, text = False, ""
    dropped = [0]
    tables = pdf_tables.find_tables(ppage, dropped)
    unmapped = pdf_content.unmapped_fonts(page)
    if unmapped and ppage is None:
        text = ""
        doc.warnings.append(
            f"page {number}: text in a font without a Unicode mapping dropped (the page could "
            "not be laid out)"
        )
    elif tables or unmapped:
        # pdfminer maps what a font's encoding or embedded cmap allows and marks the rest
        # (cid:N), which _text_outside drops; pypdf would print such glyphs as wrong letters.
        boxes = [bbox for bbox, _ in tables]
        fallback = "" if unmapped else text
        text = _text_outside(ppage, boxes, fallback=fallback, dropped=dropped)
    text, count = pdf_tables.drop_unmapped(text)
    dropped[0] += count
    if dropped[0]:
        doc.warnings.append(
            f"page {number}: {dropped[0]} words or table cells dropped: they hold glyphs "
            "without a Unicode mapping (font without ToUnicode)"
        )
    first = len(doc.elements)
    doc.elements.extend(
        Element(type="paragraph", text=p, page_number=number)
        for p in split_paragraphs(clean_text(text))
    )
    for _, element in tables:
        doc.elements.append(Element(**{**element, "page_number": number}))
    has_text = len(doc.elements) > first
    images = _image_boxes(ppage)
    if has_text and not images:
        return ok
    size = _page_size(page, ppage)
    rendered = _render(doc, number, size, for_ocr=not has_text, color=bool(images))
    if not has_text:
        _ocr_page(doc, number, rendered)
        ok = ok or number in doc.ocr_pages
    if rendered is not None and images:
        _page_assets(doc, number, rendered, images, size, first)
    return ok


def _check_size(pages: list, config: rasterize.RasterConfig) -> list[frozenset[bytes] | None]:
    """Refuse a PDF over ``config.max_pages`` pages, or with more than ``config.max_ocr_pages``
    pages that show no text and draw an image (to OCR), before any page is parsed; returns
    each page's operators."""
    if len(pages) > config.max_pages:
        raise DocumentTooLarge(
            f"the document exceeds {config.max_pages} pages ({len(pages)} pages); split it"
        )
    operators = [pdf_content.operators(page) for page in pages]
    if config.enabled:
        scans = sum(
            1
            for ops in operators
            if ops is not None and not ops & pdf_content.TEXT_OPS and b"Do" in ops
        )
        if scans > config.max_ocr_pages:
            raise DocumentTooLarge(
                f"the document exceeds {config.max_ocr_pages} pages to OCR ({scans} pages "
                "without a text layer); split it"
            )
    return operators


def _text_outside(ppage, boxes: list[tuple], *, fallback: str, dropped: list[int]) -> str:
    """The page's text without characters whose centre lies inside one of ``boxes``;
    ``fallback`` when pdfplumber fails. Glyphs pdfminer could not map to Unicode stay
    ``(cid:N)`` here; the caller drops their words.

    ``x_tolerance=1.5`` (pdfplumber's default is 3) keeps the word spaces of tightly set fonts,
    e.g. the journal page of the sample documents.
    """

    def outside(obj) -> bool:
        if obj.get("object_type") != "char":
            return True
        cx, cy = (obj["x0"] + obj["x1"]) / 2, (obj["top"] + obj["bottom"]) / 2
        return not any(x0 <= cx <= x1 and top <= cy <= bottom for x0, top, x1, bottom in boxes)

    try:
        return ppage.filter(outside).extract_text(x_tolerance=1.5) or ""
    except Exception:  # noqa: BLE001
        return fallback


def _image_boxes(ppage) -> list[tuple[float, float, float, float]]:
    """``(x0, top, x1, bottom)`` in points of the page's images large enough to store."""
    if ppage is None:
        return []
    try:
        images = ppage.images
    except Exception:  # noqa: BLE001
        return []
    boxes = []
    for image in images:
        x0, top = max(0.0, float(image["x0"])), max(0.0, float(image["top"]))
        x1, bottom = (
            min(float(ppage.width), float(image["x1"])),
            min(float(ppage.height), float(image["bottom"])),
        )
        if x1 - x0 >= _MIN_IMAGE_PT and bottom - top >= _MIN_IMAGE_PT:
            boxes.append((x0, top, x1, bottom))
    return boxes


def _page_size(page, ppage) -> tuple[float, float]:
    """Width and height in points of the page as displayed and rendered: its crop box
    (``pdftoppm -cropbox``), width and height swapped when ``/Rotate`` is 90 or 270 (pdftoppm
    and pdfplumber's image boxes both follow the rotation)."""
    try:
        box = page.cropbox
        width, height = abs(float(box.width)), abs(float(box.height))
        if int(page.rotation or 0) % 180 == 90:
            width, height = height, width
        return width, height
    except Exception:  # noqa: BLE001
        if ppage is not None:
            return float(ppage.width), float(ppage.height)
        return 612.0, 792.0


def _render(doc: _Doc, number: int, size: tuple[float, float], *, for_ocr: bool, color: bool):
    """Render the page once for OCR and/or page images; ``None`` (with a warning or a
    ``pages_without_text`` entry left to the caller) when rendering is unavailable."""
    config = doc.config
    if not config.enabled or rasterize.command_path(config) is None:
        reason = "rasterizer off" if not config.enabled else "pdftoppm is not installed"
        if for_ocr:
            doc.without_text.append(number)
            doc.warnings.append(f"page {number}: no text layer (OCR unavailable: {reason})")
        return None
    if for_ocr and not _ocr_possible():
        doc.no_ocr.add(number)
        doc.without_text.append(number)
        doc.warnings.append(
            f"page {number}: no text layer (OCR unavailable: tesseract is not installed)"
        )
        for_ocr = False
        if not color:
            return None
    if not for_ocr and (doc.capped or len(doc.assets) >= config.max_assets):
        _cap(doc)
        return None
    dpi = config.ocr_dpi if for_ocr else config.dpi
    try:
        return rasterize.render_page(
            doc.pdf_path(), number, width_pt=size[0], height_pt=size[1], dpi=dpi,
            gray=not color, config=config,
        )  # fmt: skip
    except rasterize.RasterizationError as exc:
        if "password" in exc.message.lower():
            raise EncryptedPdf() from exc
        if for_ocr:
            doc.without_text.append(number)
            doc.warnings.append(f"page {number}: no text layer (rendering failed)")
        else:
            doc.warnings.append(f"page {number}: page image not rendered ({exc.message})")
        return None


def _ocr_possible() -> bool:
    return ocr.tesseract_available()


def _ocr_page(doc: _Doc, number: int, rendered) -> None:
    """OCR a rendered page without a text layer; record the outcome on ``doc``."""
    if rendered is None or number in doc.without_text:
        return
    try:
        text = ocr.ocr_image(rendered, doc.config)
    except ocr.OcrUnavailable:
        reason = "OCR unavailable: tesseract is not installed"
    except (ocr.OcrLanguageUnavailable, ocr.OcrLowConfidence) as exc:
        doc.ocr_codes[number] = exc.code
        reason = f"{exc.code}: {exc.reason}; its OCR text is not indexed"
    except ocr.OcrFailed as exc:
        reason = exc.reason
    else:
        paragraphs = ocr.ocr_paragraphs(text, number)
        if paragraphs:
            doc.elements.extend(paragraphs)
            doc.ocr_pages.append(number)
            return
        reason = "OCR found no text"
    doc.without_text.append(number)
    doc.warnings.append(f"page {number}: no text layer ({reason})")


def _cap(doc: _Doc) -> None:
    if not doc.capped:
        doc.capped = True
        doc.warnings.append(
            f"page images limited to {doc.config.max_assets} per document; later ones skipped"
        )


def _page_assets(doc, number, rendered, boxes, size, first_element: int) -> None:
    """Crop page images (page-image DPI) and a thumbnail (thumbnail DPI) from ``rendered``."""
    config = doc.config
    width_pt, height_pt = size
    actual_dpi = rendered.width * 72.0 / max(width_pt, 1.0)
    base = rasterize.scaled(rendered, config.dpi / actual_dpi)
    scale = base.width / max(width_pt, 1.0)  # pixels per point
    covered = sum((x1 - x0) * (b - t) for x0, t, x1, b in boxes)
    if covered >= _FULL_PAGE_SHARE * width_pt * height_pt:
        boxes = [(0.0, 0.0, width_pt, height_pt)]
    element_index = first_element if len(doc.elements) > first_element else None
    for index, (x0, top, x1, bottom) in enumerate(boxes, start=1):
        crop = base.crop(
            (int(x0 * scale), int(top * scale), max(int(x1 * scale), int(x0 * scale) + 1),
             max(int(bottom * scale), int(top * scale) + 1))
        )  # fmt: skip
        if not _add_asset(doc, "page_image", crop, number, f"page-{number}-image-{index}",
                          element_index):  # fmt: skip
            return
    thumb = rasterize.scaled(base, config.thumbnail_dpi / max(config.dpi, 1))
    _add_asset(doc, "thumbnail", thumb, number, f"page-{number}-thumbnail", element_index)


def _add_asset(doc: _Doc, kind: str, image, number: int, name: str, element_index) -> bool:
    if len(doc.assets) >= doc.config.max_assets:
        _cap(doc)
        return False
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    doc.assets.append(
        Asset(
            kind=kind,
            data=rasterize.encode_png(image),
            mime_type="image/png",
            page_number=number,
            name=name,
            width=image.width,
            height=image.height,
            element_index=element_index,
        )
    )
    return True
