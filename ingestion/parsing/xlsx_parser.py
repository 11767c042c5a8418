"""XLSX parser: openpyxl (cached values; a formula without one as its text), one table per
sheet in row groups."""

from __future__ import annotations

import datetime as dt
import io
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import openpyxl
from lxml import etree
from openpyxl.utils.cell import coordinate_to_tuple, range_boundaries

from .archive import admit_zip, unsafe_entry_warnings
from .base import Element, ParseReport, collapse_ws
from .errors import CorruptDocument
from .tables import cell_lines, render_table

_CORRUPT = "corrupt or unreadable XLSX"
#: Rows per ``"table"`` element, as for CSV.
ROWS_PER_ELEMENT = 20
_MAX_TITLE_ROWS = 5
_HEADER_MAX_CHARS = 80
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_MERGE_TAG = f"{_NS}mergeCell"
_CELL_TAG = f"{_NS}c"
#: Marker after the text of a formula whose file holds no computed value.
NOT_CALCULATED = "(not calculated)"
#: Sheet states (``<sheet state=...>``) and what the parser does with them: a hidden sheet
#: (unhidden from Excel's menu) is indexed and tagged, a very hidden one (reachable only
#: from VBA, usually lookup or configuration data) is skipped; both are named in the warnings.
INDEXED_HIDDEN_STATES = frozenset({"hidden"})


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


def _used_cells(ws: Any, formulas: dict[tuple[int, int], str] | None = None) -> dict:
    """Non-empty cell texts by row and column (1-based), streamed from a read-only sheet.

    ``formulas`` gives the text of cells whose formula has no cached value (see
    :func:`_uncalculated_formulas`); they are rendered ``"=SUM(B2:B4) (not calculated)"``
    instead of an empty cell. The declared dimension is ignored (``reset_dimensions``), so a
    sheet claiming ``A1:XFD1048576`` (formatting applied to whole columns) is not padded cell
    by cell.
    """
    ws.reset_dimensions()
    formulas = formulas or {}
    cells: dict[int, dict[int, str]] = {}
    for row_number, row in enumerate(ws.iter_rows(values_only=True), start=1):
        for col_number, value in enumerate(row, start=1):
            text = format_cell(value)
            if not text and (row_number, col_number) in formulas:
                text = f"{formulas[(row_number, col_number)]} {NOT_CALCULATED}"
            if text:
                cells.setdefault(row_number, {})[col_number] = text
    return cells


def _formula_cells_without_value(archive: zipfile.ZipFile, path: str) -> set[tuple[int, int]]:
    """``(row, column)`` of every cell of a sheet part holding a formula (``<f>``) but no
    cached value (no ``<v>``, or an empty one other than a computed empty string): files
    written by scripts (openpyxl, many exporters) rather than
    by Excel. Read by streaming the XML; nothing else of the sheet is kept."""
    out: set[tuple[int, int]] = set()
    try:
        with archive.open(path) as source:
            for _event, node in etree.iterparse(source, tag=_CELL_TAG, resolve_entities=False):
                formula = node.find(f"{_NS}f")
                value = node.find(f"{_NS}v")
                # No value, or an empty one that is not a computed empty string (t="str").
                missing = value is None or (not value.text and node.get("t") != "str")
                ref = node.get("r") or ""
                node.clear()
                if formula is not None and missing and ref:
                    try:
                        row, col = coordinate_to_tuple(ref)
                    except (TypeError, ValueError):
                        continue
                    out.add((row, col))
    except (KeyError, etree.XMLSyntaxError):
        return set()
    return out


def _formula_text(value: Any) -> str:
    """Text of a formula value of a workbook opened without ``data_only``: a plain formula is
    its string (``"=SUM(B2:B4)"``), an array or data-table formula keeps its ``text``."""
    text = getattr(value, "text", value)
    return collapse_ws(str(text)) if text is not None else ""


def _uncalculated_formulas(
    formula_ws: Any, wanted: set[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """Formula texts of the cells ``wanted`` (formulas without a cached value), read from the
    same sheet of the workbook opened with formulas (shared formulas translated by openpyxl)."""
    formula_ws.reset_dimensions()
    last_row = max(row for row, _col in wanted)
    out: dict[tuple[int, int], str] = {}
    for row_number, row in enumerate(formula_ws.iter_rows(values_only=True), start=1):
        if row_number > last_row:
            break
        for col_number, value in enumerate(row, start=1):
            if (row_number, col_number) in wanted:
                text = _formula_text(value)
                if text:
                    out[(row_number, col_number)] = text if text.startswith("=") else f"={text}"
    return out


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


def sheet_grid(
    ws: Any,
    merged: Sequence[tuple[int, int, int, int]] = (),
    formulas: dict[tuple[int, int], str] | None = None,
) -> list[list[str]]:
    """Cell texts of a worksheet, merged ranges resolved and empty rows/columns trimmed.

    A merged range's value (its top-left cell) is carried to the first column of every row
    the range covers that has other content, so each row keeps its label (case BC-07); the
    other columns of a horizontally merged range stay empty, so the value is never repeated
    within a row. Only stored cells are visited (see :func:`_used_cells`).
    """
    return grid_from_cells(_used_cells(ws, formulas), merged)


def grid_from_cells(
    cells: dict[int, dict[int, str]], merged: Sequence[tuple[int, int, int, int]] = ()
) -> list[list[str]]:
    """Rows of non-empty cell texts (``{row: {column: text}}``, 1-based) with the merged
    ranges ``(min_col, min_row, max_col, max_row)`` carried as :func:`sheet_grid` describes,
    empty rows and columns trimmed (shared with the legacy XLS parser)."""
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


def _sheet_elements(title: str, rows: list[list[str]], state: str = "visible") -> list[Element]:
    path = (title,)
    tag = {"sheet_state": state} if state != "visible" else {}
    out = [Element(type="heading", text=title, section_path=path, level=1, metadata=dict(tag))]
    width = len(rows[0]) if rows else 0
    titles = 0
    while len(rows) > 1 and width > 1 and titles < _MAX_TITLE_ROWS:
        filled = [c for c in rows[0] if c]
        if len(filled) > 1:
            break
        out.append(Element(type="paragraph", text=filled[0], section_path=path, metadata=dict(tag)))
        rows = rows[1:]
        titles += 1
    header: list[str] | None = None
    if looks_like_header(rows[0], rows[1:]):
        header, rows = rows[0], rows[1:]
    for start in range(0, len(rows), ROWS_PER_ELEMENT):
        text, meta = render_table(
            header, rows[start : start + ROWS_PER_ELEMENT], with_header=start == 0
        )
        meta.update(sheet=title, first_row=start + 1)  # the chunk metadata's sheet and rows
        if text.strip():
            out.append(
                Element(type="table", text=text, section_path=path, metadata={**meta, **tag})
            )
    return out


def parse_xlsx(data: bytes) -> ParseReport:
    """Parse XLSX bytes: every worksheet in workbook order.

    Per sheet: a level-1 ``"heading"`` with the sheet name (the ``section_path`` of everything
    in the sheet); leading rows with a single non-empty cell (sheet titles, up to 5) become
    ``"paragraph"`` elements; the next row is the header when :func:`looks_like_header`;
    the remaining rows become ``"table"`` elements of up to 20 rows each, rendered
    ``"Level: Department level; Rate: 480"`` (metadata ``{"header", "rows"}``). Values are
    the cached results (``data_only``); a formula cell without a cached value (a file written
    by a script, not by Excel) is indexed as its formula marked ``"=SUM(B2:B4) (not
    calculated)"``, never as an empty or made-up number, and the sheets holding such cells are
    named in a warning. Hidden sheets are indexed with ``metadata["sheet_state"] = "hidden"``
    on their elements; very hidden sheets (only reachable from macros) are skipped; both are
    named in the warnings. Merged cells and trimming as in :func:`sheet_grid`. The workbook is
    read in openpyxl's read-only (streaming) mode and merged ranges from the sheet XML, so
    neither a huge declared dimension nor a merge over a whole column expands into millions of
    cells. Chart sheets and empty sheets contribute nothing.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        CorruptDocument: "corrupt or unreadable XLSX".
    """
    summary = admit_zip(data, "XLSX")
    workbook = _load(data, data_only=True)
    formula_book = None
    out: list[Element] = []
    notes: list[str] = unsafe_entry_warnings(summary)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for index, ws in enumerate(workbook.worksheets):
                title = collapse_ws(str(ws.title)) or "Sheet"
                state = str(getattr(ws, "sheet_state", "visible") or "visible")
                if state != "visible" and state not in INDEXED_HIDDEN_STATES:
                    notes.append(f"sheet {title!r} is very hidden and was not indexed")
                    continue
                if state != "visible":
                    notes.append(f"sheet {title!r} is hidden; it was indexed and tagged hidden")
                part = ws._worksheet_path.lstrip("/")
                merged = _merged_ranges(archive, part)
                formulas = None
                pending = _formula_cells_without_value(archive, part)
                if pending:
                    if formula_book is None:
                        formula_book = _load(data, data_only=False)
                    formulas = _uncalculated_formulas(formula_book.worksheets[index], pending)
                    notes.append(
                        f"sheet {title!r}: {len(pending)} formula cells have no calculated value"
                        f" in the file; their formulas are indexed marked {NOT_CALCULATED}"
                    )
                rows = sheet_grid(ws, merged, formulas)
                if rows:
                    out.extend(_sheet_elements(title, rows, state))
    finally:
        workbook.close()
        if formula_book is not None:
            formula_book.close()
    return ParseReport(
        elements=out, page_count=None, pages_without_text=[], parser="openpyxl", warnings=notes
    )


def _load(data: bytes, *, data_only: bool) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # openpyxl warns about unsupported extensions
            return openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=data_only)
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
