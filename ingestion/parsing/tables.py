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


def render_row(header: list[str] | None, row: list[str]) -> str:
    """Render one row as ``"h1: v1; h2: v2"`` (empty values skipped) or, without a header,
    as the non-empty cells joined by ``" | "``. Whitespace inside each line of a cell is
    collapsed; a cell's own line breaks (a quoted CSV cell or a spreadsheet cell with several
    lines) are kept, so such a row renders on several lines (:func:`row_line_count`)."""
    cells = [cell_lines(c) for c in row]
    if header is None:
        return " | ".join(c for c in cells if c)
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
    :func:`render_row`); a header-only table is
    rendered as its header cells joined by ``" | "``. ``metadata`` is
    ``{"header": header_or_None, "rows": rows}`` where ``rows`` excludes the header row.
    """
    lines = [line for line in (render_row(header, r) for r in rows) if line]
    if not lines and header:
        lines = [render_row(None, header)]
    return "\n".join(lines), {"header": header, "rows": rows}
