"""Document parsing: bytes of a supported format -> ordered structural :class:`Element` list.

Pure Python (no Django). Entry points:

* :func:`sniff_mime_type` - content-first type detection of an upload;
* :func:`parse` / :func:`parse_with_report` - dispatch to the format parser.

Every failure is a :class:`ParseError` subclass with a stable ``code`` and a client-safe
``message``.
"""

from __future__ import annotations

import dataclasses

from .archive import ArchiveRejected
from .base import SUPPORTED_MIME_TYPES, Asset, Element, ParseReport, clean_text
from .csv_parser import parse_csv
from .docx_parser import parse_docx
from .email_parser import parse_eml, parse_msg
from .epub_parser import parse_epub
from .errors import (
    ContentMismatch,
    CorruptDocument,
    EmptyDocument,
    EncodingError,
    EncryptedDocument,
    ParseError,
    ProtectedDocument,
    TooManyChunks,
    UnsupportedType,
)
from .html_parser import parse_html_report
from .legacy_office import parse_doc, parse_ppt
from .markdown_parser import parse_markdown
from .odf_parser import parse_odp, parse_ods, parse_odt
from .pdf_parser import parse_pdf
from .pptx_parser import parse_pptx
from .rtf_parser import parse_rtf
from .sniff import sniff_mime_type
from .text_parser import parse_text
from .xls_parser import parse_xls
from .xlsx_parser import parse_xlsx
from .xml_parser import parse_xml

__all__ = [
    "SUPPORTED_MIME_TYPES",
    "ArchiveRejected",
    "Asset",
    "ContentMismatch",
    "CorruptDocument",
    "Element",
    "EmptyDocument",
    "EncodingError",
    "EncryptedDocument",
    "ParseError",
    "ParseReport",
    "ProtectedDocument",
    "TooManyChunks",
    "UnsupportedType",
    "normalize_mime_type",
    "parse",
    "parse_with_report",
    "sniff_mime_type",
]

_ALIASES = {
    "text/x-markdown": "text/markdown",
    "text/md": "text/markdown",
    "application/csv": "text/csv",
    "text/x-csv": "text/csv",
    "text/tab-separated-values": "text/csv",
    "application/xhtml+xml": "text/html",
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
    "image/heic-sequence": "image/heic",
    "image/heif-sequence": "image/heif",
    "application/x-msg": "application/vnd.ms-outlook",
    "message/x-emlx": "message/rfc822",
    "text/xml": "application/xml",
    "text/rtf": "application/rtf",
    "application/x-rtf": "application/rtf",
}

_PARSER_NAMES = {
    "txt": "native-text",
    "markdown": "native-markdown",
    "html": "native-html",
    "csv": "native-csv",
    "pdf": "pypdf",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "xlsx": "openpyxl",
    "eml": "native-email",
    "msg": "olefile-msg",
    "epub": "native-epub",
    "image": "tesseract",
    "xml": "lxml-xml",
    "odt": "native-odf",
    "ods": "native-odf",
    "odp": "native-odf",
    "rtf": "striprtf",
    "doc": "antiword",
    "xls": "xlrd",
    "ppt": "olefile-ppt",
}

#: Parser of each format other than PDF and images: bytes -> elements, or a full report when
#: it also returns assets or warnings. :func:`_dispatch` calls the function of that name in
#: this module, so a test can substitute one (``monkeypatch.setattr(parsing, "parse_html_report",
#: ...)``).
_SIMPLE_PARSERS = {
    "docx": parse_docx,
    "pptx": parse_pptx,
    "xlsx": parse_xlsx,
    "eml": parse_eml,
    "msg": parse_msg,
    "epub": parse_epub,
    "html": parse_html_report,
    "markdown": parse_markdown,
    "csv": parse_csv,
    "txt": parse_text,
    "xml": parse_xml,
    "odt": parse_odt,
    "ods": parse_ods,
    "odp": parse_odp,
    "rtf": parse_rtf,
    "doc": parse_doc,
    "xls": parse_xls,
    "ppt": parse_ppt,
}


def _parse_image(data: bytes) -> ParseReport:
    """An image document goes to OCR (imported here: the OCR module is optional)."""
    try:
        from .ocr import parse_image
    except ImportError as exc:
        raise ParseError(
            "image documents cannot be read: OCR is not available", code="ocr_unavailable"
        ) from exc
    return parse_image(data)


def normalize_mime_type(mime_type: str) -> str:
    """Lower-case, drop parameters (``; charset=...``) and map common aliases
    (e.g. ``text/x-markdown``) to the keys of :data:`SUPPORTED_MIME_TYPES`."""
    base = (mime_type or "").split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def _finalise(elements: list[Element]) -> tuple[list[Element], dict[int, int]]:
    """Clean and strip texts (and section paths); drop whitespace-only elements.

    Returns the kept elements and a map old index -> new index (for asset references).
    """
    out: list[Element] = []
    index_map: dict[int, int] = {}
    for old_index, element in enumerate(elements):
        text = clean_text(element.text).strip()
        if not text:
            continue
        path = tuple(" ".join(clean_text(p).split()) for p in element.section_path)
        if text != element.text or path != element.section_path:
            element = dataclasses.replace(element, text=text, section_path=path)
        index_map[old_index] = len(out)
        out.append(element)
    return out, index_map


def _finalise_report(report: ParseReport, parser: str) -> ParseReport:
    elements, index_map = _finalise(report.elements)
    assets = [
        a
        if a.element_index is None
        else dataclasses.replace(a, element_index=index_map.get(a.element_index))
        for a in report.assets
    ]
    return dataclasses.replace(
        report, elements=elements, assets=assets, parser=report.parser or parser
    )


def _dispatch(fmt: str, data: bytes) -> ParseReport:
    if fmt == "pdf":
        result = parse_pdf(data)
        if isinstance(result, ParseReport):
            return result
        return ParseReport(
            elements=result.elements,
            page_count=result.page_count,
            pages_without_text=result.pages_without_text,
            parser=_PARSER_NAMES[fmt],
        )
    if fmt == "image":
        return _parse_image(data)
    parser = globals()[_SIMPLE_PARSERS[fmt].__name__]
    result = parser(data)
    if isinstance(result, ParseReport):
        return result
    return ParseReport(
        elements=result, page_count=None, pages_without_text=[], parser=_PARSER_NAMES[fmt]
    )


def parse_with_report(data: bytes, mime_type: str) -> ParseReport:
    """Parse ``data`` of the given MIME type and report how.

    Args:
        data: the raw file bytes.
        mime_type: one of :data:`SUPPORTED_MIME_TYPES` (parameters and common aliases are
            accepted), typically from :func:`sniff_mime_type`.

    Returns:
        :class:`ParseReport` with the elements (none whitespace-only, text stripped), the PDF
        page count and pages without a text layer, extracted image assets (DOCX, PPTX, EML,
        MSG, EPUB), warnings, and the parser name (:data:`_PARSER_NAMES`). Image documents
        are handed to ``ingestion.parsing.ocr.parse_image``.

    Raises:
        EmptyDocument: ``data`` is empty (code ``"empty_file"``).
        UnsupportedType: ``mime_type`` is not supported.
        EncodingError: text formats whose encoding cannot be determined.
        EncryptedDocument: PDF needing a user password.
        ProtectedDocument: DRM-encrypted EPUB (code ``"drm_protected"``).
        ArchiveRejected: a ZIP-based document refused by the container inspection (code
            ``"archive_rejected"``).
        CorruptDocument: damaged files, with a format-specific message; any unexpected
            library error is wrapped as ``"corrupt or unreadable <FORMAT>"``.
    """
    mime = normalize_mime_type(mime_type)
    fmt = SUPPORTED_MIME_TYPES.get(mime)
    if fmt is None:
        raise UnsupportedType(mime or str(mime_type))
    if not data:
        raise EmptyDocument()
    try:
        report = _dispatch(fmt, data)
    except ParseError:
        raise
    except RecursionError as exc:
        raise CorruptDocument(f"corrupt or unreadable {fmt.upper()} (nesting too deep)") from exc
    except Exception as exc:
        raise CorruptDocument(f"corrupt or unreadable {fmt.upper()}") from exc
    return _finalise_report(report, _PARSER_NAMES[fmt])


def parse(data: bytes, mime_type: str) -> list[Element]:
    """Parse ``data`` into elements; shorthand for ``parse_with_report(...).elements``.

    Raises the same errors as :func:`parse_with_report`.
    """
    return parse_with_report(data, mime_type).elements
