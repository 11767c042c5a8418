"""Shared types of the parsing package: elements, assets, the parse report and the text and
image helpers every parser uses. The error hierarchy is in :mod:`ingestion.parsing.errors`.

Pure Python, no Django imports.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

ELEMENT_TYPES: frozenset[str] = frozenset(
    {"title", "heading", "paragraph", "table", "list", "code"}
)

#: MIME type -> short format name, for every format :func:`ingestion.parsing.parse` accepts.
SUPPORTED_MIME_TYPES: dict[str, str] = {
    "text/plain": "txt",
    "text/markdown": "markdown",
    "text/html": "html",
    "text/csv": "csv",
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "application/epub+zip": "epub",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/vnd.oasis.opendocument.spreadsheet": "ods",
    "application/vnd.oasis.opendocument.presentation": "odp",
    "application/rtf": "rtf",
    "application/msword": "doc",
    "application/vnd.ms-excel": "xls",
    "application/vnd.ms-powerpoint": "ppt",
    "message/rfc822": "eml",
    "application/mbox": "eml",
    "application/xml": "xml",
    "application/vnd.ms-outlook": "msg",
    "image/png": "image",
    "image/jpeg": "image",
    "image/tiff": "image",
    "image/gif": "image",
    "image/bmp": "image",
    "image/webp": "image",
    "image/heic": "image",
    "image/heif": "image",
}

#: Most embedded images one document's parser returns as :class:`Asset` objects (seed
#: deployment guide: "at most 500 assets per document"); further images are counted in a
#: warning instead.
MAX_ASSETS = 500


@dataclass(frozen=True)
class Element:
    """One structural block of a parsed document.

    Attributes:
        type: one of ``"title"``, ``"heading"``, ``"paragraph"``, ``"table"``, ``"list"``,
            ``"code"``.
        text: the block's text (never whitespace-only in parser output). Tables carry a
            readable rendering, one row per line (``header: value; header: value`` when the
            table has a header row, else cells joined by ``" | "``).
        page_number: 1-based page for PDFs, 1-based slide number for PPTX (both used for
            citations); ``None`` for every other format.
        section_path: texts of the headings enclosing the element, outermost first; a
            heading's own path ends with itself.
        level: heading level 1..6 for headings, ``None`` otherwise.
        metadata: JSON-serialisable, format-specific extras: tables carry
            ``{"header": [...] or None, "rows": [[...], ...]}`` (rows exclude the header row),
            code may carry ``{"language": "python"}``, DOCX header/footer text
            ``{"part": "header"|"footer"}``, PPTX speaker notes ``{"part": "notes"}``, e-mail
            header blocks ``{"part": "headers"}`` and attachment listings
            ``{"part": "attachment", "name", "mime_type", "size"}``, Markdown front matter
            ``{"part": "front_matter"}``, block quotes ``{"quote": True}``. (Being a dict, it
            makes the element unhashable.)
    """

    type: str
    text: str
    page_number: int | None = None
    section_path: tuple[str, ...] = ()
    level: int | None = None
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Asset:
    """A binary object a parser extracted or rendered (an embedded image, a rasterized PDF page).

    Parsers return assets with their bytes; compilation stores them through the storage
    boundary (``knowledgefs.storage.put_object``) and keeps only a reference in the parse
    artifact.

    Attributes:
        kind: ``"image"`` (embedded picture), ``"page_image"`` (a rasterized PDF page or the
            image area of one) or ``"thumbnail"``.
        data: the encoded bytes (PNG or JPEG for rendered pages; embedded images keep the
            format they were stored in: PNG, JPEG, GIF, BMP, TIFF, WebP, EMF, ...).
        mime_type: the MIME type of ``data``, e.g. ``"image/png"`` or ``"image/jpeg"``.
        page_number: 1-based page for PDFs (slide number for PPTX), else ``None``.
        name: the name inside the source (e.g. ``"word/media/image1.png"``), or ``""``.
        width, height: pixels, or ``None`` when unknown.
        element_index: index into :attr:`ParseReport.elements` of the element the asset
            illustrates, or ``None``.
    """

    kind: str
    data: bytes
    mime_type: str
    page_number: int | None = None
    name: str = ""
    width: int | None = None
    height: int | None = None
    element_index: int | None = None


@dataclass(frozen=True)
class ParseReport:
    """Result of :func:`ingestion.parsing.parse_with_report`.

    Attributes:
        elements: the document's elements in reading order (no whitespace-only ones).
        page_count: number of pages for PDFs, ``None`` for formats without pages.
        pages_without_text: 1-based numbers of PDF pages with no extractable text layer
            (e.g. scans); empty for other formats.
        parser: name of the library/parser used, e.g. ``"pypdf"``, ``"python-docx"``,
            ``"python-pptx"``, ``"openpyxl"``, ``"native-email"``, ``"olefile-msg"``,
            ``"native-epub"``, ``"native-markdown"``, ``"native-html"``, ``"native-text"``,
            ``"native-csv"``.
        assets: extracted or rendered images (see :class:`Asset`), at most the configured
            per-document asset cap.
        ocr_pages: 1-based pages whose text came from OCR (they are not in
            ``pages_without_text``); for an image document, ``[1]``.
        warnings: short client-safe notes, e.g. ``"page 3: no text layer (OCR unavailable)"``.
    """

    elements: list[Element]
    page_count: int | None
    pages_without_text: list[int]
    parser: str
    assets: list[Asset] = field(default_factory=list)
    ocr_pages: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_WS_RE = re.compile(r"\s+")
# C0 controls except TAB and LF, DEL, stray U+FEFF and lone surrogates (which cannot be
# stored as UTF-8); VT/FF become line breaks.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\ufeff\ud800-\udfff]")


def collapse_ws(text: str) -> str:
    """Collapse every run of Unicode whitespace to one space and strip the ends."""
    return _WS_RE.sub(" ", text).strip()


def clean_text(text: str) -> str:
    """Normalise line endings to LF, turn VT/FF into LF and drop other control characters,
    U+FEFF and lone surrogates."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\x0b", "\n").replace("\x0c", "\n")
    return _CONTROL_RE.sub("", text)


class SectionStack:
    """Tracks enclosing headings while a parser walks a document in reading order."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    @property
    def path(self) -> tuple[str, ...]:
        """Current section path, outermost heading first."""
        return tuple(text for _, text in self._stack)

    def push(self, level: int, text: str) -> tuple[str, ...]:
        """Enter a heading of ``level`` (1..6): pops headings of the same or deeper level and
        returns the new path, which ends with ``text``."""
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, text))
        return self.path

    def snapshot(self) -> list[tuple[int, str]]:
        """The current stack, for :meth:`restore`."""
        return list(self._stack)

    def restore(self, snapshot: list[tuple[int, str]]) -> None:
        """Go back (in place) to a stack taken by :meth:`snapshot`."""
        self._stack[:] = snapshot


_IMAGE_SUFFIX_MIME = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "bmp": "image/bmp",
    "tif": "image/tiff",
    "tiff": "image/tiff",
    "webp": "image/webp",
    "heic": "image/heic",
    "heif": "image/heif",
    "emf": "image/emf",
    "wmf": "image/wmf",
    "svg": "image/svg+xml",
}


#: Major brands of the ISO base media file ``ftyp`` box that name a HEIF image (ISO/IEC
#: 23008-12): HEVC-coded (HEIC, iPhone photos) and the generic image brands.
_HEIF_BRANDS = {
    **dict.fromkeys((b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"), "image/heic"),
    **dict.fromkeys((b"mif1", b"msf1"), "image/heif"),
}


def image_mime_type(data: bytes, name: str = "") -> str | None:
    """MIME type of an embedded image: from its magic number (PNG, JPEG, GIF, TIFF, WebP,
    BMP, HEIC/HEIF), else from the suffix of ``name`` (EMF, WMF, SVG, ...); ``None`` when
    neither says it is an image."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:2] == b"BM" and len(data) > 26:
        return "image/bmp"
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        return _HEIF_BRANDS[data[8:12]]
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return _IMAGE_SUFFIX_MIME.get(suffix)


def image_size(data: bytes) -> tuple[int | None, int | None]:
    """``(width, height)`` in pixels from an image's header (Pillow reads no pixel data), or
    ``(None, None)`` when Pillow cannot tell."""
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
        return int(width), int(height)
    except Exception:  # noqa: BLE001 - sizes are informative; unknown formats stay None
        return None, None


def image_asset(data: bytes, mime_type: str, name: str, page_number: int | None = None) -> Asset:
    """An ``Asset(kind="image")`` with its pixel size read from the header."""
    width, height = image_size(data)
    return Asset(
        kind="image",
        data=data,
        mime_type=mime_type,
        page_number=page_number,
        name=name,
        width=width,
        height=height,
    )
