"""Elements of an Unstructured-compatible parser (its JSON list) -> our :class:`Element` list.

The parser answers a list of objects ``{"type": "Title", "element_id": ..., "text": ...,
"metadata": {"page_number": 1, "category_depth": 0, "text_as_html": "<table>...",
"page_name": "Sheet1", "filename": "report.pdf", ...}}``. Mapping:

========================================  =====================================================
parser ``type`` (``category``)             our element
========================================  =====================================================
``Title``                                  ``heading``, level ``category_depth + 1`` (1..6); it
                                           opens a section for what follows
``ListItem``                               ``list``
``Table``                                  ``table``: ``metadata.text_as_html`` becomes
                                           ``{"header": [...] or None, "rows": [[...]]}`` and
                                           the ``header: value`` rendering of
                                           :func:`ingestion.parsing.tables.render_table`
``CodeSnippet``                            ``code``
``Header`` / ``Footer``                    ``paragraph`` with ``{"part": "header"|"footer"}``
``PageBreak`` / ``PageNumber``             dropped
anything else (``NarrativeText``,          ``paragraph``
``Text``, ``UncategorizedText``,
``Image`` with OCR text, ...)
========================================  =====================================================

``metadata.page_number`` becomes :attr:`Element.page_number` for PDFs only (our convention);
for slides and sheets it is kept as ``metadata["page"]`` (and ``page_name`` as
``metadata["sheet"]``). A ``metadata.filename`` different from the one sent (an e-mail
attachment) is kept as ``metadata["attachment"]``.
"""

from __future__ import annotations

import re
from typing import Any

from bs4 import BeautifulSoup

from ingestion.parsing.base import Element, ParseReport, SectionStack, clean_text, collapse_ws
from ingestion.parsing.tables import render_table

from .errors import ParserEmptyOutput, ParserInvalidResponse

PARSER_NAME = "unstructured"

_DROPPED = frozenset({"PageBreak", "PageNumber"})
_TYPES = {"Title": "heading", "ListItem": "list", "Table": "table", "CodeSnippet": "code"}
_NUMBER_RE = re.compile(r"^[\s$€£%+\-.,0-9]+$")
#: Grid bounds for a table from ``text_as_html`` (a hostile rowspan must not allocate much).
MAX_SPAN = 100
MAX_TABLE_CELLS = 200_000


def to_report(items: Any, *, mime_type: str, filename: str) -> ParseReport:
    """Map the parser's JSON answer to a :class:`ParseReport` (``parser="unstructured"``).

    Args:
        items: the decoded JSON answer; must be a list of objects with a string ``type`` and a
            string ``text``.
        mime_type: the normalised MIME type that was sent; ``application/pdf`` keeps page
            numbers on the elements and reports ``page_count``/``pages_without_text`` (pages
            up to the last one seen that have no element).
        filename: the filename that was sent (to tell attachments apart).

    Raises:
        ParserInvalidResponse: not a list, or an entry without a string ``type`` and ``text``.
        ParserEmptyOutput: no element with text (an empty list included).
    """
    if not isinstance(items, list):
        raise ParserInvalidResponse(
            f"the parser's answer is a JSON {type(items).__name__}, not a list of elements"
        )
    is_pdf = mime_type == "application/pdf"
    sections = SectionStack()
    elements: list[Element] = []
    pages: set[int] = set()
    for index, item in enumerate(items):
        element = _element(item, index, sections, is_pdf=is_pdf, filename=filename)
        if element is not None:
            elements.append(element)
            if element.page_number is not None:
                pages.add(element.page_number)
    if not elements:
        raise ParserEmptyOutput(
            f"the parser returned no text for {filename!r} ({len(items)} elements, none with text)"
        )
    page_count = max(pages) if is_pdf and pages else None
    missing = [p for p in range(1, (page_count or 0) + 1) if p not in pages]
    return ParseReport(
        elements=elements, page_count=page_count, pages_without_text=missing, parser=PARSER_NAME
    )


def _element(
    item: Any, index: int, sections: SectionStack, *, is_pdf: bool, filename: str
) -> Element | None:
    if not isinstance(item, dict):
        raise ParserInvalidResponse(f"element {index} of the parser's answer is not an object")
    category = item.get("type", item.get("category"))
    text = item.get("text")
    if not isinstance(category, str) or not isinstance(text, str):
        raise ParserInvalidResponse(
            f"element {index} of the parser's answer has no string 'type' and 'text'"
        )
    metadata = item.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise ParserInvalidResponse(f"element {index} of the parser's answer has bad metadata")
    if category in _DROPPED:
        return None
    kind = _TYPES.get(category, "paragraph")
    extra: dict[str, Any] = {}
    level: int | None = None
    if kind == "table":
        text, extra = _table(metadata.get("text_as_html"), text)
    text = clean_text(text).strip()
    if not text:
        return None
    if category in ("Header", "Footer"):
        extra["part"] = category.lower()
    page = metadata.get("page_number")
    page = page if isinstance(page, int) and not isinstance(page, bool) and page > 0 else None
    if page is not None and not is_pdf:
        extra["page"] = page
    sheet = metadata.get("page_name")
    if isinstance(sheet, str) and sheet.strip():
        extra["sheet"] = sheet.strip()
    source = metadata.get("filename")
    if isinstance(source, str) and source and source != filename:
        extra["attachment"] = source
    if kind == "heading":
        level = _level(metadata.get("category_depth"))
        path = sections.push(level, collapse_ws(text))
    else:
        path = sections.path
    return Element(
        type=kind,
        text=text,
        page_number=page if is_pdf else None,
        section_path=path,
        level=level,
        metadata=extra,
    )


def _level(depth: Any) -> int:
    if isinstance(depth, int) and not isinstance(depth, bool):
        return min(max(depth + 1, 1), 6)
    return 1


def _table(html: Any, fallback: str) -> tuple[str, dict]:
    """``(text, {"header", "rows"})`` from ``text_as_html``; without usable HTML the flat text
    is kept as a one-row table without header."""
    grid, header_marked = _grid(html) if isinstance(html, str) and html.strip() else ([], False)
    grid = [row for row in grid if any(cell for cell in row)]
    if not grid:
        text = collapse_ws(fallback)
        return text, {"header": None, "rows": [[text]] if text else []}
    if header_marked or _looks_like_header(grid):
        return render_table(grid[0], grid[1:])
    return render_table(None, grid)


def _grid(html: str) -> tuple[list[list[str]], bool]:
    """Rows of cell texts with ``rowspan``/``colspan`` carried to every cell they cover, and
    whether the first row is marked as a header (``<th>`` cells or ``<thead>``)."""
    soup = BeautifulSoup(html, "html.parser")
    table = soup.find("table")
    if table is None:
        return [], False
    rows: list[list[str]] = []
    carried: dict[tuple[int, int], str] = {}
    header_marked = False
    cells_total = 0
    for r, tr in enumerate(table.find_all("tr")):
        if tr.find_parent("table") is not table:
            continue
        row: list[str] = []
        cells = tr.find_all(["td", "th"], recursive=False)
        if r == 0 and cells:
            header_marked = tr.find_parent("thead") is not None or all(
                c.name == "th" for c in cells
            )
        col = 0
        for cell in cells:
            while (len(rows), col) in carried:
                row.append(carried.pop((len(rows), col)))
                col += 1
            value = collapse_ws(cell.get_text(" "))
            colspan, rowspan = _span(cell.get("colspan")), _span(cell.get("rowspan"))
            for c in range(colspan):
                row.append(value)
                for below in range(1, rowspan):
                    carried[(len(rows) + below, col + c)] = value
            col += colspan
        while (len(rows), col) in carried:
            row.append(carried.pop((len(rows), col)))
            col += 1
        cells_total += len(row)
        if cells_total > MAX_TABLE_CELLS:
            break
        rows.append(row)
    return rows, header_marked


def _span(value: Any) -> int:
    try:
        return min(max(int(str(value or 1)), 1), MAX_SPAN)
    except ValueError:
        return 1


def _looks_like_header(grid: list[list[str]]) -> bool:
    """The docx parser's heuristic: a first row of at least two short, distinct, non-numeric,
    non-empty cells, with most body rows as wide."""
    if len(grid) < 2:
        return False
    first = grid[0]
    if len(first) < 2 or any(not c or len(c) > 60 or _NUMBER_RE.match(c) for c in first):
        return False
    if len(set(first)) != len(first):
        return False
    same = sum(1 for row in grid[1:] if len(row) == len(first))
    return same >= max(1, (len(grid) - 1) * 0.8)
