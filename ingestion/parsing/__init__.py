"""Document parsing: bytes of a supported format -> ordered structural :class:`Element` list.

Pure Python (no Django). Entry points:

* :func:`sniff_mime_type` - content-first type detection of an upload;
* :func:`parse` / :func:`parse_with_report` - dispatch to the format parser.

Every failure is a :class:`ParseError` subclass with a stable ``code`` and a client-safe
``message``.
"""

from __future__ import annotations

import dataclasses

from .base import (
    SUPPORTED_MIME_TYPES,
    CorruptDocument,
    Element,
    EmptyDocument,
    EncodingError,
    EncryptedDocument,
    ParseError,
    ParseReport,
    TooManyChunks,
    UnsupportedType,
    clean_text,
)
from .csv_parser import parse_csv
from .docx_parser import parse_docx
from .html_parser import parse_html
from .markdown_parser import parse_markdown
from .pdf_parser import parse_pdf
from .sniff import sniff_mime_type
from .text_parser import parse_text

__all__ = [
    "SUPPORTED_MIME_TYPES",
    "CorruptDocument",
    "Element",
    "EmptyDocument",
    "EncodingError",
    "EncryptedDocument",
    "ParseError",
    "ParseReport",
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
}

_PARSER_NAMES = {
    "txt": "native-text",
    "markdown": "native-markdown",
    "html": "native-html",
    "csv": "native-csv",
    "pdf": "pypdf",
    "docx": "python-docx",
}


def normalize_mime_type(mime_type: str) -> str:
    """Lower-case, drop parameters (``; charset=...``) and map common aliases
    (e.g. ``text/x-markdown``) to the keys of :data:`SUPPORTED_MIME_TYPES`."""
    base = (mime_type or "").split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def _finalise(elements: list[Element]) -> list[Element]:
    """Clean and strip texts (and section paths); drop whitespace-only elements."""
    out = []
    for element in elements:
        text = clean_text(element.text).strip()
        if not text:
            continue
        path = tuple(" ".join(clean_text(p).split()) for p in element.section_path)
        if text != element.text or path != element.section_path:
            element = dataclasses.replace(element, text=text, section_path=path)
        out.append(element)
    return out


def parse_with_report(data: bytes, mime_type: str) -> ParseReport:
    """Parse ``data`` of the given MIME type and report how.

    Args:
        data: the raw file bytes.
        mime_type: one of :data:`SUPPORTED_MIME_TYPES` (parameters and common aliases are
            accepted), typically from :func:`sniff_mime_type`.

    Returns:
        :class:`ParseReport` with the elements (none whitespace-only, text stripped), the PDF
        page count and pages without a text layer, and the parser name.

    Raises:
        EmptyDocument: ``data`` is empty (code ``"empty_file"``).
        UnsupportedType: ``mime_type`` is not supported.
        EncodingError: text formats whose encoding cannot be determined.
        EncryptedDocument: PDF needing a user password.
        CorruptDocument: damaged files; any unexpected library error is wrapped as
            ``"corrupt or unreadable <FORMAT>"``.
    """
    mime = normalize_mime_type(mime_type)
    fmt = SUPPORTED_MIME_TYPES.get(mime)
    if fmt is None:
        raise UnsupportedType(mime or str(mime_type))
    if not data:
        raise EmptyDocument()
    page_count: int | None = None
    pages_without_text: list[int] = []
    try:
        if fmt == "pdf":
            report = parse_pdf(data)  # elements are already clean: asset indices stay valid
            return dataclasses.replace(report, elements=_finalise(report.elements))
        elif fmt == "docx":
            elements = parse_docx(data)
        elif fmt == "html":
            elements = parse_html(data)
        elif fmt == "markdown":
            elements = parse_markdown(data)
        elif fmt == "csv":
            elements = parse_csv(data)
        else:
            elements = parse_text(data)
    except ParseError:
        raise
    except RecursionError as exc:
        raise CorruptDocument(f"corrupt or unreadable {fmt.upper()} (nesting too deep)") from exc
    except Exception as exc:
        raise CorruptDocument(f"corrupt or unreadable {fmt.upper()}") from exc
    return ParseReport(
        elements=_finalise(elements),
        page_count=page_count,
        pages_without_text=pages_without_text,
        parser=_PARSER_NAMES[fmt],
    )


def parse(data: bytes, mime_type: str) -> list[Element]:
    """Parse ``data`` into elements; shorthand for ``parse_with_report(...).elements``.

    Raises the same errors as :func:`parse_with_report`.
    """
    return parse_with_report(data, mime_type).elements
