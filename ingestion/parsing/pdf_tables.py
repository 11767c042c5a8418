"""Tables of a PDF page with pdfplumber: ruled grids, else "booktabs" tables ruled by
horizontal lines only (journal style). Used by :mod:`ingestion.parsing.pdf_parser`.

Each table becomes ``(bbox, fields)``: ``fields`` are the keyword arguments of a ``"table"``
:class:`~ingestion.parsing.base.Element` in the shared convention
(:mod:`ingestion.parsing.tables`): the first row is the header,
``metadata={"header": [...], "rows": [[...], ...]}``. Glyphs pdfminer could not map to Unicode
(``(cid:N)``) never reach a cell: a cell holding one is left empty and counted (a glyph alone
cannot be dropped: the minus of "-0.94" in a math font would turn the value into "0.94").
"""

from __future__ import annotations

import re

from .tables import render_table

#: pdfminer's text for a glyph whose font gives no Unicode mapping (no ToUnicode, no usable
#: encoding or embedded cmap).
UNMAPPED_GLYPH = re.compile(r"\(cid:\d+\)")
_UNMAPPED_WORD = re.compile(r"[^\s]*\(cid:\d+\)[^\s]*")


def drop_unmapped(text: str) -> tuple[str, int]:
    """``text`` without the words (runs without white space) that hold a ``(cid:N)``
    placeholder, and how many were dropped: such a word cannot be read reliably."""
    cleaned, count = _UNMAPPED_WORD.subn("", text)
    return cleaned, count


def _cell(value: str | None, dropped: list[int]) -> str:
    """A cell's text, stripped; empty when it holds an unmapped glyph (``dropped[0]`` + 1)."""
    text = (value or "").strip()
    if UNMAPPED_GLYPH.search(text):
        dropped[0] += 1
        return ""
    return text


def find_tables(ppage, dropped: list[int] | None = None) -> list[tuple[tuple, dict]]:
    """``[(bbox, table element fields), ...]`` of the page's tables with at least one cell:
    grid tables (ruling lines both ways), else tables ruled by horizontal lines only.

    ``dropped[0]`` (when given) grows by the number of cells emptied for unmapped glyphs.
    """
    dropped = dropped if dropped is not None else [0]
    if ppage is None:
        return []
    try:
        found = ppage.find_tables()
    except Exception:  # noqa: BLE001 - tables are best effort
        return []
    out = []
    for table in found:
        try:
            rows = [[_cell(cell, dropped) for cell in row] for row in table.extract()]
        except Exception:  # noqa: BLE001
            continue
        rows = [row for row in rows if any(row)]
        if not rows or sum(len(row) for row in rows) < 2:
            continue
        header, body = (rows[0], rows[1:]) if len(rows) > 1 else (None, rows)
        out.append((table.bbox, _table_fields(header, body)))
    if not out:
        out = _rule_tables(ppage, dropped)
    return [(bbox, fields) for bbox, fields in out if fields["text"].strip()]


def _table_fields(header: list[str] | None, body: list[list[str]]) -> dict:
    text, metadata = render_table(header, body)
    return {"type": "table", "text": text, "metadata": metadata}


# A "booktabs" table (journals): full-width horizontal rules above the header, below it and
# below the body, no vertical lines. Limits that keep prose between page rules out: the header
# band is at most this high (points), body cells are short, every body row has two cells.
_RULE_MIN_SHARE = 0.2
_HEADER_BAND_MAX_PT = 60.0
_RULE_GAP_MAX_PT = 300.0
_CELL_MAX_CHARS = 40
_COLUMN_GAP_PT = 7.0


def _rules(ppage) -> list[list[tuple[float, float, float]]]:
    """Horizontal rules ``(top, x0, x1)`` grouped by their span, each group sorted by top; a
    rule drawn as a thin rectangle (two edges) counts once."""
    groups: list[list[tuple[float, float, float]]] = []
    for edge in sorted(ppage.edges, key=lambda e: e["top"]):
        if edge["orientation"] != "h" or edge["x1"] - edge["x0"] < _RULE_MIN_SHARE * ppage.width:
            continue
        rule = (float(edge["top"]), float(edge["x0"]), float(edge["x1"]))
        for group in groups:
            last = group[-1]
            if abs(last[1] - rule[1]) <= 3 and abs(last[2] - rule[2]) <= 3:
                if rule[0] - last[0] > 2:
                    group.append(rule)
                break
        else:
            groups.append([rule])
    return groups


def _rule_tables(ppage, dropped: list[int]) -> list[tuple[tuple, dict]]:
    """Tables ruled only by horizontal lines: the rows between the first and the last rule of a
    span, split into columns by pdfplumber's text alignment; rows above the second rule are the
    header (joined per column)."""
    try:
        groups = _rules(ppage)
    except Exception:  # noqa: BLE001
        return []
    out = []
    for group in groups:
        for run in _runs(group):
            found = _rule_table(ppage, run, dropped)
            if found is not None:
                out.append(found)
    return out


def _runs(group: list[tuple[float, float, float]]) -> list[list[tuple[float, float, float]]]:
    """Split a span's rules where they are far apart; keep runs of three or more."""
    runs: list[list[tuple[float, float, float]]] = [[group[0]]]
    for rule in group[1:]:
        if rule[0] - runs[-1][-1][0] > _RULE_GAP_MAX_PT:
            runs.append([])
        runs[-1].append(rule)
    return [run for run in runs if len(run) >= 3 and run[1][0] - run[0][0] <= _HEADER_BAND_MAX_PT]


def _columns_are_gapped(crop, table, header_end: float) -> bool:
    """True when most body rows show a gap of at least :data:`_COLUMN_GAP_PT` between each pair
    of neighbouring filled cells: table columns are set apart, prose words are not (text
    alignment alone also "finds" columns in a paragraph between two page rules). Words are
    placed in rows and cells by their centre."""
    words = crop.extract_words(x_tolerance=1.5)
    considered = good = 0
    for row in table.rows:
        _, top, _, bottom = row.bbox
        if top < header_end:
            continue
        line = sorted(
            (w for w in words if top <= (w["top"] + w["bottom"]) / 2 < bottom),
            key=lambda w: w["x0"],
        )
        if not line:
            continue
        considered += 1
        centres = [(w["x0"] + w["x1"]) / 2 for w in line]
        filled = sum(
            1
            for cell in row.cells
            if cell is not None and any(cell[0] <= x < cell[2] for x in centres)
        )
        pairs = zip(line, line[1:], strict=False)
        gaps = sum(1 for a, b in pairs if b["x0"] - a["x1"] >= _COLUMN_GAP_PT)
        good += filled >= 2 and gaps >= filled - 1
    return considered > 0 and good >= 0.8 * considered


def _rule_table(ppage, run, dropped: list[int]) -> tuple[tuple, dict] | None:
    top, x0, x1 = run[0]
    bottom, header_end = run[-1][0], run[1][0]
    try:
        crop = ppage.crop((x0, max(0.0, top - 1), x1, min(float(ppage.height), bottom + 1)))
        tables = crop.find_tables({"vertical_strategy": "text", "horizontal_strategy": "text"})
        if not tables:
            return None
        table = max(tables, key=lambda t: len(t.cells))
        rows = [
            (row.bbox[1], [_cell(cell, dropped) for cell in cells])
            for row, cells in zip(table.rows, table.extract(), strict=False)
        ]
        if not _columns_are_gapped(crop, table, header_end):
            return None
    except Exception:  # noqa: BLE001
        return None
    head = [cells for y, cells in rows if y < header_end and any(cells)]
    body = [cells for y, cells in rows if y >= header_end and any(cells)]
    width = max((len(cells) for _, cells in rows), default=0)
    if width < 2 or not body:
        return None
    if any(sum(1 for c in cells if c) < 2 for cells in body):
        return None
    if any(len(c) > _CELL_MAX_CHARS for cells in body for c in cells):
        return None
    header = None
    if head:
        header = [" ".join(r[i] for r in head if i < len(r) and r[i]) for i in range(width)]
    return (x0, top, x1, bottom), _table_fields(header, body)
