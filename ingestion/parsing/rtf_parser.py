"""RTF parser: striprtf (BSD-3-Clause) turns the control words into text, honouring the
document's code page (``\\ansicpgN``) and the fonts' character sets (``\\fcharsetN``) for
``\\'hh`` escapes and ``\\uN`` Unicode escapes; table cells and rows are marked before the
conversion, so a table keeps its column positions."""

from __future__ import annotations

import codecs
import re

from striprtf.striprtf import rtf_to_text

from .base import Element, ParseReport, collapse_ws
from .errors import CorruptDocument
from .tables import render_table
from .xlsx_parser import looks_like_header

_CORRUPT = "corrupt or unreadable RTF"
_CELL_MARK = "\ue000"
_ROW_MARK = "\ue001"
_IN_TABLE = "\ue002"
_IN_TABLE_RE = re.compile(r"(?<!\\)\\intbl(?![A-Za-z])\s?")
_CELL_RE = re.compile(r"(?<!\\)\\(?:nest)?cell(?![A-Za-z])\s?")
_ROW_RE = re.compile(r"(?<!\\)\\(?:nest)?row(?![A-Za-z])\s?")
_CODEPAGE_RE = re.compile(rb"\\ansicpg(\d{1,5})")


def _codec(data: bytes) -> str:
    """Codec of the raw 8-bit bytes, from ``\\ansicpgN`` (cp1252 when absent or unknown)."""
    match = _CODEPAGE_RE.search(data[:8192])
    if match:
        name = f"cp{int(match.group(1))}"
        try:
            codecs.lookup(name)
            return name
        except LookupError:
            pass
    return "cp1252"


def rtf_plain_text(data: bytes) -> str:
    """The text of an RTF document, table cells ended by U+E000, rows by U+E001 and table
    paragraphs (``\\intbl``) opened by U+E002."""
    if not data.lstrip()[:5] == b"{\\rtf":
        raise CorruptDocument(f"{_CORRUPT}: it does not start with {{\\rtf")
    codec = _codec(data)
    source = data.decode(codec, errors="replace")
    source = _CELL_RE.sub(r"\\u57344?", source)
    source = _ROW_RE.sub(r"\\u57345?\\par ", source)
    source = _IN_TABLE_RE.sub(r"\\u57346?", source)
    try:
        return rtf_to_text(source, encoding=codec, errors="replace")
    except Exception as exc:  # noqa: BLE001 - striprtf raises assorted errors on damage
        raise CorruptDocument(_CORRUPT) from exc


def _table(rows: list[list[str]]) -> Element | None:
    width = max((len(r) for r in rows), default=0)
    rows = [r + [""] * (width - len(r)) for r in rows if any(r)]
    if not rows:
        return None
    if len(rows) > 1 and looks_like_header(rows[0], rows[1:]):
        text, meta = render_table(rows[0], rows[1:])
    else:
        text, meta = render_table(None, rows)
    return Element(type="table", text=text, metadata=meta)


def parse_rtf(data: bytes) -> ParseReport:
    """Parse RTF bytes: one ``"paragraph"`` per RTF paragraph, and one ``"table"`` element
    per run of table rows (``\\cell``/``\\row``), each row on the grid of its cells (a blank
    cell keeps its position; the first row is the header when it looks like one).

    Raises:
        CorruptDocument: "corrupt or unreadable RTF".
    """
    text = rtf_plain_text(data)
    out: list[Element] = []
    paragraph: list[str] = []
    table: list[list[str]] = []

    def flush_paragraph() -> None:
        joined = "\n".join(paragraph).strip()
        if joined:
            out.append(Element(type="paragraph", text=joined))
        paragraph.clear()

    def flush_table() -> None:
        element = _table(table)
        if element is not None:
            out.append(element)
        table.clear()

    row: list[str] = []  # the lines of a table row not ended yet (cells of several paragraphs)

    def end_row() -> None:
        joined = " ".join(row).replace(_IN_TABLE, "").replace(_ROW_MARK, "")
        cells = joined.split(_CELL_MARK)
        if cells and not cells[-1].strip():
            cells = cells[:-1]  # the text after the last cell mark
        table.append([collapse_ws(c) for c in cells])
        row.clear()

    for line in text.replace("\r\n", "\n").split("\n"):
        if row or any(mark in line for mark in (_IN_TABLE, _CELL_MARK, _ROW_MARK)):
            flush_paragraph()
            row.append(line)
            if _ROW_MARK in line:
                end_row()
            continue
        flush_table()
        if line.strip():
            paragraph.append(line.strip())
        flush_paragraph()  # one paragraph per \par (a \line break ends one too)
    if row:
        end_row()
    flush_table()
    flush_paragraph()
    return ParseReport(elements=out, page_count=None, pages_without_text=[], parser="striprtf")
