"""Plain-text parser: decoded text split into paragraphs on blank lines."""

from __future__ import annotations

import re

from .base import Element, ParseReport
from .encoding import decode_text_report

_BLANK_LINE_RE = re.compile(r"\n[ \t\u00a0\u3000]*\n\s*")


def split_paragraphs(text: str) -> list[str]:
    """Split LF-normalised text on blank lines; return the non-blank paragraphs, stripped."""
    out = []
    for part in _BLANK_LINE_RE.split(text):
        part = "\n".join(line.rstrip() for line in part.strip().split("\n"))
        if part:
            out.append(part)
    return out


def parse_text(data: bytes) -> ParseReport:
    """Parse plain-text bytes into ``"paragraph"`` elements (parser ``"native-text"``).

    The report's warnings carry the decoder's notes (e.g. invalid UTF-8 bytes replaced, see
    :func:`ingestion.parsing.encoding.decode_text_report`).

    Raises:
        EncodingError: when the bytes are not text in a detectable encoding.
    """
    decoded = decode_text_report(data)
    elements = [Element(type="paragraph", text=p) for p in split_paragraphs(decoded.text)]
    return ParseReport(
        elements=elements,
        page_count=None,
        pages_without_text=[],
        parser="native-text",
        warnings=list(decoded.warnings),
    )
