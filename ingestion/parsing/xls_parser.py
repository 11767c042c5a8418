"""Legacy Excel (XLS, BIFF 2-8) parser: xlrd, rendered like XLSX.

xlrd (BSD) is the maintained reader of the binary format (its 2.x releases read XLS only,
the format it was written for); it reads the cached values Excel stores with each formula,
merged ranges (with ``formatting_info``), dates by the workbook's date mode and the sheets'
visibility.
"""

from __future__ import annotations

from typing import Any

import xlrd
from xlrd.biffh import XLRDError

from .base import ParseReport, collapse_ws
from .errors import CorruptDocument, EncryptedDocument
from .xlsx_parser import INDEXED_HIDDEN_STATES, _sheet_elements, format_cell, grid_from_cells

_CORRUPT = "corrupt or unreadable XLS"
_STATES = {0: "visible", 1: "hidden", 2: "veryHidden"}
#: Cells read per sheet at most (a BIFF8 sheet holds up to 65,536 × 256).
MAX_CELLS = 2_000_000


def _cell_text(book: Any, cell: Any) -> str:
    kind, value = cell.ctype, cell.value
    if kind == xlrd.XL_CELL_DATE:
        try:
            return format_cell(xlrd.xldate.xldate_as_datetime(value, book.datemode))
        except (ValueError, OverflowError, xlrd.xldate.XLDateError):
            return format_cell(value)
    if kind == xlrd.XL_CELL_BOOLEAN:
        return format_cell(bool(value))
    if kind == xlrd.XL_CELL_ERROR:
        return xlrd.error_text_from_code.get(value, "#ERR")
    if kind in (xlrd.XL_CELL_EMPTY, xlrd.XL_CELL_BLANK):
        return ""
    return format_cell(value)


def _open(data: bytes) -> Any:
    try:
        return xlrd.open_workbook(file_contents=data, formatting_info=True, on_demand=True)
    except XLRDError as exc:
        if "encrypt" in str(exc).lower():
            raise EncryptedDocument("encrypted XLS, password required") from exc
        raise CorruptDocument(_CORRUPT) from exc
    except Exception as exc:  # noqa: BLE001 - xlrd raises CompDocError, struct.error, ...
        raise CorruptDocument(_CORRUPT) from exc


def parse_xls(data: bytes) -> ParseReport:
    """Parse legacy XLS bytes: every worksheet in workbook order, as :func:`parse_xlsx` does
    (sheet headings, title rows, header detection, tables of 20 rows, merged ranges carried
    to every row they cover, dates ISO 8601, Excel's cached formula results). Hidden sheets
    are indexed and tagged ``sheet_state: hidden``, very hidden ones skipped; both are named
    in the warnings.

    Raises:
        EncryptedDocument: (code ``encrypted_document``) a password-protected workbook.
        CorruptDocument: "corrupt or unreadable XLS".
    """
    book = _open(data)
    out = []
    notes: list[str] = []
    try:
        for index in range(book.nsheets):
            sheet = book.sheet_by_index(index)
            title = collapse_ws(str(sheet.name)) or "Sheet"
            state = _STATES.get(sheet.visibility, "visible")
            if state != "visible" and state not in INDEXED_HIDDEN_STATES:
                notes.append(f"sheet {title!r} is very hidden and was not indexed")
                continue
            if state != "visible":
                notes.append(f"sheet {title!r} is hidden; it was indexed and tagged hidden")
            cells: dict[int, dict[int, str]] = {}
            if sheet.nrows * sheet.ncols > MAX_CELLS:
                notes.append(f"sheet {title!r}: cells beyond the first {MAX_CELLS} were not read")
            read = 0
            for r in range(sheet.nrows):
                if read >= MAX_CELLS:
                    break
                for c, cell in enumerate(sheet.row(r)):
                    text = _cell_text(book, cell)
                    if text:
                        cells.setdefault(r + 1, {})[c + 1] = text
                read += sheet.ncols
            # xlrd: (row_lo, row_hi, col_lo, col_hi), half-open, 0-based
            merged = [(c0 + 1, r0 + 1, c1, r1) for r0, r1, c0, c1 in sheet.merged_cells]
            rows = grid_from_cells(cells, merged)
            if rows:
                out.extend(_sheet_elements(title, rows, state))
            book.unload_sheet(index)
    except (EncryptedDocument, CorruptDocument):
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged sheet record
        raise CorruptDocument(_CORRUPT) from exc
    finally:
        book.release_resources()
    return ParseReport(
        elements=out, page_count=None, pages_without_text=[], parser="xlrd", warnings=notes
    )
