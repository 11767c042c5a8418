"""Readable text rendering of tables, shared by every parser that emits ``"table"`` elements."""

from __future__ import annotations

from .base import collapse_ws


def render_row(header: list[str] | None, row: list[str]) -> str:
    """Render one row as ``"h1: v1; h2: v2"`` (empty values skipped) or, without a header,
    as the non-empty cells joined by ``" | "``. Cell whitespace (incl. newlines) is collapsed,
    so a row is always exactly one line."""
    cells = [collapse_ws(c) for c in row]
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

    ``text`` has one line per non-empty row (see :func:`render_row`); a header-only table is
    rendered as its header cells joined by ``" | "``. ``metadata`` is
    ``{"header": header_or_None, "rows": rows}`` where ``rows`` excludes the header row.
    """
    lines = [line for line in (render_row(header, r) for r in rows) if line]
    if not lines and header:
        lines = [render_row(None, header)]
    return "\n".join(lines), {"header": header, "rows": rows}
