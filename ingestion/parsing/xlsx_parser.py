"""XLSX parser: openpyxl (cached values, not formulas), one table per sheet in row groups."""

from __future__ import annotations

import datetime as dt
import io
import warnings
from typing import Any

import openpyxl

from .base import CorruptDocument, Element, admit_zip, collapse_ws
from .tables import render_table

_CORRUPT = "corrupt or unreadable XLSX"
#: Rows per ``"table"`` element, as for CSV.
ROWS_PER_ELEMENT = 20
_MAX_TITLE_ROWS = 5
_HEADER_MAX_CHARS = 80


def format_cell(value: Any) -> str:
    """Text of a cell value: ``None`` -> ``""``; dates ISO 8601 (``2024-03-01``, with the time
    only when it is not midnight); whole floats without ``.0``, others to 15 significant
    digits as Excel shows them; booleans ``TRUE``/``FALSE``;
    whitespace collapsed."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0, 0) and value.tzinfo is None:
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.15g}"  # Excel shows 15 significant digits: 0.1 + 0.2 -> 0.3
    return collapse_ws(str(value))


def sheet_grid(ws: Any) -> list[list[str]]:
    """Cell texts of a worksheet, merged ranges resolved and empty rows/columns trimmed.

    A merged range's value (its top-left cell) is carried to the first column of every row
    the range covers, so each row keeps its label (case BC-07); the other columns of a
    horizontally merged range stay empty, so the value is never repeated within a row.
    """
    grid = [[format_cell(v) for v in row] for row in ws.iter_rows(values_only=True)]
    for merged in ws.merged_cells.ranges:
        top, left = merged.min_row - 1, merged.min_col - 1
        if top >= len(grid) or left >= len(grid[top]):
            continue
        value = grid[top][left]
        for r in range(top + 1, min(merged.max_row, len(grid))):
            if left < len(grid[r]):
                grid[r][left] = value
    rows = [r for r in grid if any(r)]
    if not rows:
        return []
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    keep = [c for c in range(width) if any(r[c] for r in rows)]
    return [[r[c] for c in keep] for r in rows]


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def looks_like_header(row: list[str], body: list[list[str]]) -> bool:
    """A header row has at least two non-empty cells (or every cell filled for one column),
    all short and none numeric, and at least one row follows it."""
    filled = [c for c in row if c]
    if not body or not filled:
        return False
    if len(filled) < min(2, len(row)):
        return False
    return all(len(c) <= _HEADER_MAX_CHARS and not _is_number(c) for c in filled)


def _sheet_elements(title: str, rows: list[list[str]]) -> list[Element]:
    path = (title,)
    out = [Element(type="heading", text=title, section_path=path, level=1)]
    width = len(rows[0]) if rows else 0
    titles = 0
    while len(rows) > 1 and width > 1 and titles < _MAX_TITLE_ROWS:
        filled = [c for c in rows[0] if c]
        if len(filled) > 1:
            break
        out.append(Element(type="paragraph", text=filled[0], section_path=path))
        rows = rows[1:]
        titles += 1
    header: list[str] | None = None
    if looks_like_header(rows[0], rows[1:]):
        header, rows = rows[0], rows[1:]
    for start in range(0, len(rows), ROWS_PER_ELEMENT):
        text, meta = render_table(header, rows[start : start + ROWS_PER_ELEMENT])
        if text.strip():
            out.append(Element(type="table", text=text, section_path=path, metadata=meta))
    return out


def parse_xlsx(data: bytes) -> list[Element]:
    """Parse XLSX bytes: every worksheet in workbook order.

    Per sheet: a level-1 ``"heading"`` with the sheet name (the ``section_path`` of everything
    in the sheet); leading rows with a single non-empty cell (sheet titles, up to 5) become
    ``"paragraph"`` elements; the next row is the header when :func:`looks_like_header`;
    the remaining rows become ``"table"`` elements of up to 20 rows each, rendered
    ``"Level: Department level; Rate: 480"`` (metadata ``{"header", "rows"}``). Values are
    the cached results (``data_only``), not formulas; merged cells and trimming as in
    :func:`sheet_grid`. Chart sheets and empty sheets contribute nothing.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        CorruptDocument: "corrupt or unreadable XLSX".
    """
    admit_zip(data, "XLSX")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # openpyxl warns about unsupported extensions
            workbook = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    out: list[Element] = []
    try:
        for ws in workbook.worksheets:
            rows = sheet_grid(ws)
            title = collapse_ws(str(ws.title)) or "Sheet"
            if rows:
                out.extend(_sheet_elements(title, rows))
    finally:
        workbook.close()
    return out
