"""XLSX parser: openpyxl (cached values, not formulas), one table per sheet in row groups."""

from __future__ import annotations

import datetime as dt
import io
import warnings
import zipfile
from typing import Any

import openpyxl
from lxml import etree
from openpyxl.utils.cell import range_boundaries

from .archive import admit_zip
from .base import Element, collapse_ws
from .errors import CorruptDocument
from .tables import cell_lines, render_table

_CORRUPT = "corrupt or unreadable XLSX"
#: Rows per ``"table"`` element, as for CSV.
ROWS_PER_ELEMENT = 20
_MAX_TITLE_ROWS = 5
_HEADER_MAX_CHARS = 80
_MERGE_TAG = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}mergeCell"


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
    return cell_lines(str(value))  # a cell's own line breaks (Alt+Enter) are kept


def _used_cells(ws: Any) -> dict[int, dict[int, str]]:
    """Non-empty cell texts by row and column (1-based), streamed from a read-only sheet.

    The declared dimension is ignored (``reset_dimensions``), so a sheet claiming
    ``A1:XFD1048576`` (formatting applied to whole columns) is not padded cell by cell.
    """
    ws.reset_dimensions()
    cells: dict[int, dict[int, str]] = {}
    for row_number, row in enumerate(ws.iter_rows(values_only=True), start=1):
        for col_number, value in enumerate(row, start=1):
            text = format_cell(value)
            if text:
                cells.setdefault(row_number, {})[col_number] = text
    return cells


def _merged_ranges(archive: zipfile.ZipFile, path: str) -> list[tuple[int, int, int, int]]:
    """``(min_col, min_row, max_col, max_row)`` of every ``<mergeCell ref>`` of a sheet part,
    read by streaming its XML (openpyxl would create an object per covered cell)."""
    out = []
    try:
        with archive.open(path) as source:
            for _event, node in etree.iterparse(source, tag=_MERGE_TAG, resolve_entities=False):
                ref = node.get("ref") or ""
                node.clear()
                try:
                    out.append(range_boundaries(ref))
                except (TypeError, ValueError):
                    continue
    except KeyError:
        return []
    return [r for r in out if None not in r]


def sheet_grid(ws: Any, merged: list[tuple[int, int, int, int]] = ()) -> list[list[str]]:
    """Cell texts of a worksheet, merged ranges resolved and empty rows/columns trimmed.

    A merged range's value (its top-left cell) is carried to the first column of every row
    the range covers that has other content, so each row keeps its label (case BC-07); the
    other columns of a horizontally merged range stay empty, so the value is never repeated
    within a row. Only stored cells are visited (see :func:`_used_cells`).
    """
    cells = _used_cells(ws)
    for min_col, min_row, _max_col, max_row in merged:
        value = cells.get(min_row, {}).get(min_col, "")
        if not value:
            continue
        covered = range(min_row + 1, max_row + 1)
        rows = covered if len(covered) <= len(cells) else sorted(cells)
        for row in rows:
            if row in covered and row in cells:
                cells[row][min_col] = value
    columns = sorted({col for row in cells.values() for col in row})
    return [[cells[r].get(c, "") for c in columns] for r in sorted(cells)]


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
        meta.update(sheet=title, first_row=start + 1)  # the chunk metadata's sheet and rows
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
    :func:`sheet_grid`. The workbook is read in openpyxl's read-only (streaming) mode and merged
    ranges from the sheet XML, so neither a huge declared dimension nor a merge over a whole
    column expands into millions of cells. Chart sheets and empty sheets contribute nothing.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        CorruptDocument: "corrupt or unreadable XLSX".
    """
    admit_zip(data, "XLSX")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # openpyxl warns about unsupported extensions
            workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    out: list[Element] = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for ws in workbook.worksheets:
                merged = _merged_ranges(archive, ws._worksheet_path.lstrip("/"))
                rows = sheet_grid(ws, merged)
                title = collapse_ws(str(ws.title)) or "Sheet"
                if rows:
                    out.extend(_sheet_elements(title, rows))
    finally:
        workbook.close()
    return out
