"""Readable text rendering of tables, shared by every parser that emits ``"table"`` elements."""

from __future__ import annotations

from .base import collapse_ws


def cell_lines(value: str) -> str:
    """A cell's text with its line breaks kept: each line's whitespace collapsed, blank lines
    dropped (a spreadsheet cell written as "line one\nline two" keeps its two lines)."""
    return "\n".join(line for line in (collapse_ws(p) for p in value.splitlines()) if line)


def row_line_count(row: list[str]) -> int:
    """Lines :func:`render_row` gives ``row`` (cells as :func:`cell_lines` returns them)."""
    return 1 + sum(c.count("\n") for c in row if c.strip())


def render_row(header: list[str] | None, row: list[str], *, positional: bool = False) -> str:
    """Render one row as ``"h1: v1; h2: v2"`` (empty values skipped: the names keep the
    positions) or, without a header, as the cells joined by ``" | "``: with ``positional``
    (every data table, see :func:`render_table`) a blank cell keeps its position
    (``"1-1 |  | 1-3"``, case BC-08), so later values never move into its column; only blank
    cells at the end of the row are dropped and an all-blank row renders ``""``. Without it
    only the non-empty cells are joined (text laid out in a table, not data). Whitespace
    inside each line of a cell is collapsed; a cell's own line breaks (a quoted CSV cell or a
    spreadsheet cell with several lines, case BC-06) are kept, so such a row renders on
    several lines (:func:`row_line_count`)."""
    cells = [cell_lines(c) for c in row]
    if header is None:
        if not positional:
            return " | ".join(c for c in cells if c)
        while cells and not cells[-1]:
            cells.pop()
        return " | ".join(cells).lstrip()  # a leading blank cell: "| b | c"
    parts = []
    for idx, value in enumerate(cells):
        if not value:
            continue
        name = collapse_ws(header[idx]) if idx < len(header) else ""
        parts.append(f"{name or f'column {idx + 1}'}: {value}")
    return "; ".join(parts)


def render_table(header: list[str] | None, rows: list[list[str]]) -> tuple[str, dict]:
    """Render a table to ``(text, metadata)``.

    ``text`` has one line per non-empty row, more for cells with line breaks (see
    :func:`render_row`; blank cells keep their column, so every row lines up); a column blank
    in every row and in the header (a spacer column of an HTML layout, a column a merge leaves
    empty everywhere) is left out of the text of every row alike. A header-only table is
    rendered as its header cells joined by ``" | "``. ``metadata`` is
    ``{"header": header_or_None, "rows": rows}`` where ``rows`` excludes the header row and
    keeps every column.
    """
    width = max((len(r) for r in [*rows, header or []]), default=0)
    used = [
        i for i in range(width) if any(i < len(r) and r[i].strip() for r in [*rows, header or []])
    ]
    if header is None and len(used) < width:
        shown = [[r[i] if i < len(r) else "" for i in used] for r in rows]
    else:
        shown = rows
    lines = [line for line in (render_row(header, r, positional=True) for r in shown) if line]
    if not lines and header:
        lines = [render_row(None, header, positional=True)]
    return "\n".join(lines), {"header": header, "rows": rows}
