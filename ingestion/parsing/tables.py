"""Readable text rendering of tables, shared by every parser that emits ``"table"`` elements."""

from __future__ import annotations

import re

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


def markdown_row(cells: list[str]) -> str:
    """``| a | b |``: a Markdown table row; a ``|`` inside a cell is escaped (``\\|``)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def header_block(header: list[str], width: int | None = None) -> str:
    """A Markdown table's header row and its separator (``| --- | --- |``), ``width`` columns
    (a column without a name is ``column N``)."""
    width = max(width or 0, len(header))
    names = [collapse_ws(header[i]) if i < len(header) else "" for i in range(width)]
    names = [name or f"column {i + 1}" for i, name in enumerate(names)]
    return markdown_row(names) + "\n" + markdown_row(["---"] * width)


_SEPARATOR_RE = re.compile(r"\| ---(?: \| ---)* \|")


def header_lines(text: str, metadata: dict | None) -> int:
    """How many lines of a table element's ``text`` are its header row and separator: 2 when
    it starts with them (:func:`render_table` with a header), else 0."""
    if not (metadata or {}).get("header"):
        return 0
    lines = text.lstrip().split("\n", 2)
    return 2 if len(lines) > 1 and _SEPARATOR_RE.fullmatch(lines[1]) else 0


def render_table(
    header: list[str] | None, rows: list[list[str]], *, with_header: bool = True
) -> tuple[str, dict]:
    """Render a table to ``(text, metadata)``.

    With a header the text is a Markdown table (case BC-38): the header row, the separator and
    one ``| v1 | v2 |`` line per non-empty row (more for cells with line breaks, see
    :func:`row_line_count`), every row as wide as the table so a blank cell keeps its column;
    ``with_header=False`` leaves out the header and separator lines (a later slice of a table a
    parser splits into several elements: the chunker repeats the header for it as context, see
    :func:`header_lines`). Without a header the
    rows are the cells joined by ``" | "`` (:func:`render_row`); a column blank in every row and
    in the header (a spacer column of an HTML layout, a column a merge leaves empty everywhere)
    is left out of the text of every row alike, and a header-only table is its header row and
    separator. ``metadata`` is ``{"header": header_or_None, "rows": rows}`` where ``rows``
    excludes the header row and keeps every column.
    """
    width = max((len(r) for r in [*rows, header or []]), default=0)
    used = [
        i for i in range(width) if any(i < len(r) and r[i].strip() for r in [*rows, header or []])
    ]
    if header is not None:
        lines = []
        for row in rows:
            cells = [cell_lines(row[i]) if i < len(row) else "" for i in used]
            if any(cells):
                lines.append(markdown_row(cells))
        named = [header[i] if i < len(header) else "" for i in used]
        top = [header_block(named)] if with_header and used else []
        text = "\n".join(top + lines)
        return text, {"header": header, "rows": rows}
    shown = (
        [[r[i] if i < len(r) else "" for i in used] for r in rows] if len(used) < width else rows
    )
    lines = [line for line in (render_row(None, r, positional=True) for r in shown) if line]
    return "\n".join(lines), {"header": header, "rows": rows}
