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

``page_number`` must be absent, ``null`` or an integer from 1 to :data:`MAX_PAGE_NUMBER`, else
the answer is refused (``parser_invalid_response``): an admitted upload (15 MiB, at most
50 MiB) cannot have more pages, and a hostile number must not size anything.
``pages_without_text`` lists at most
:data:`MAX_PAGES_WITHOUT_TEXT` page numbers (the lowest).

Tables are bounded before anything is allocated: ``rowspan``/``colspan`` are clamped to
1..:data:`MAX_SPAN`, and the cells the spans cover (every copy counted) and their characters
(a repeated header name included) are counted against :data:`MAX_TABLE_CELLS` and
:data:`MAX_TABLE_CHARS` for the whole answer as each cell is placed. An answer over either
is refused with ``parser_invalid_response`` naming the limit (not silently truncated): the
grid a 32 MiB answer can make stays bounded whatever its spans.
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
#: The largest ``metadata.page_number`` accepted: far above the pages of any admitted upload
#: (``KNOWLEDGE_UPLOAD_MAX_BYTES`` 15 MiB, at most 50 MiB; a PDF page takes well over 500 bytes).
MAX_PAGE_NUMBER = 100_000
#: ``pages_without_text`` lists at most this many page numbers (the lowest ones).
MAX_PAGES_WITHOUT_TEXT = 1_000
#: Grid bounds for the tables of one answer (``text_as_html``): a span covers at most
#: ``MAX_SPAN`` rows or columns; all tables together may cover at most ``MAX_TABLE_CELLS``
#: cells and ``MAX_TABLE_CHARS`` characters of cell text (each copy a span makes, and a header
#: name repeated on every row, counted) -- twice the 32 MiB response cap, so no legitimate
#: answer is refused while a hostile span cannot multiply it further.
MAX_SPAN = 100
MAX_TABLE_CELLS = 2_000_000
MAX_TABLE_CHARS = 64 * 1024 * 1024


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
        ParserInvalidResponse: not a list, an entry without a string ``type`` and ``text``, a
            ``page_number`` that is not an integer from 1 to :data:`MAX_PAGE_NUMBER`, or tables
            over :data:`MAX_TABLE_CELLS` / :data:`MAX_TABLE_CHARS`.
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
    budget = _TableBudget()
    for index, item in enumerate(items):
        element = _element(item, index, sections, budget, is_pdf=is_pdf, filename=filename)
        if element is not None:
            elements.append(element)
            if element.page_number is not None:
                pages.add(element.page_number)
    if not elements:
        raise ParserEmptyOutput(
            f"the parser returned no text for {filename!r} ({len(items)} elements, none with text)"
        )
    page_count = max(pages) if is_pdf and pages else None
    missing = _missing_pages(pages, page_count or 0)
    return ParseReport(
        elements=elements, page_count=page_count, pages_without_text=missing, parser=PARSER_NAME
    )


def _missing_pages(pages: set[int], page_count: int) -> list[int]:
    """The lowest :data:`MAX_PAGES_WITHOUT_TEXT` numbers in ``1..page_count`` not in ``pages``
    (``page_count`` is at most :data:`MAX_PAGE_NUMBER`; nothing of its size is built)."""
    missing: list[int] = []
    for page in range(1, page_count + 1):
        if page not in pages:
            missing.append(page)
            if len(missing) >= MAX_PAGES_WITHOUT_TEXT:
                break
    return missing


def _page_number(metadata: dict, index: int) -> int | None:
    """``metadata.page_number``: None when absent or null, else an int in 1..MAX_PAGE_NUMBER."""
    page = metadata.get("page_number")
    if page is None:
        return None
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= MAX_PAGE_NUMBER:
        shown = repr(page) if len(repr(page)) <= 40 else repr(page)[:40] + "..."
        raise ParserInvalidResponse(
            f"element {index} of the parser's answer has page_number {shown}; it must be an "
            f"integer from 1 to {MAX_PAGE_NUMBER}"
        )
    return page


def _element(
    item: Any,
    index: int,
    sections: SectionStack,
    budget: _TableBudget,
    *,
    is_pdf: bool,
    filename: str,
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
    page = _page_number(metadata, index)
    if category in _DROPPED:
        return None
    kind = _TYPES.get(category, "paragraph")
    extra: dict[str, Any] = {}
    level: int | None = None
    if kind == "table":
        text, extra = _table(metadata.get("text_as_html"), text, budget, index)
    text = clean_text(text).strip()
    if not text:
        return None
    if category in ("Header", "Footer"):
        extra["part"] = category.lower()
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


class _TableBudget:
    """Cells and characters the tables of one answer may still place (see module docstring)."""

    def __init__(self) -> None:
        self.cells = 0
        self.chars = 0

    def take(self, cells: int, chars: int, index: int) -> None:
        """Count ``cells`` more cells of ``chars`` characters for element ``index``; raises
        :class:`ParserInvalidResponse` naming the limit before the caller allocates them."""
        self.cells += cells
        self.chars += chars
        if self.cells > MAX_TABLE_CELLS:
            raise ParserInvalidResponse(
                f"the tables of the parser's answer cover more than {MAX_TABLE_CELLS} cells once "
                f"their rowspan/colspan are expanded (at element {index}); refused"
            )
        if self.chars > MAX_TABLE_CHARS:
            raise ParserInvalidResponse(
                f"the tables of the parser's answer hold more than {MAX_TABLE_CHARS} characters "
                f"once their rowspan/colspan are expanded (at element {index}); refused"
            )


def _table(html: Any, fallback: str, budget: _TableBudget, index: int) -> tuple[str, dict]:
    """``(text, {"header", "rows"})`` from ``text_as_html``; without usable HTML the flat text
    is kept as a one-row table without header."""
    usable = isinstance(html, str) and html.strip()
    grid, header_marked = _grid(html, budget, index) if usable else ([], False)
    grid = [row for row in grid if any(cell for cell in row)]
    if not grid:
        text = collapse_ws(fallback)
        return text, {"header": None, "rows": [[text]] if text else []}
    if header_marked or _looks_like_header(grid):
        header = grid[0]
        repeats = sum(
            len(header[c]) for row in grid[1:] for c, v in enumerate(row) if v and c < len(header)
        )
        budget.take(0, repeats, index)  # "name: value" repeats the header on every row
        return render_table(header, grid[1:])
    return render_table(None, grid)


def _grid(html: str, budget: _TableBudget, index: int) -> tuple[list[list[str]], bool]:
    """Rows of cell texts with ``rowspan``/``colspan`` carried to every cell they cover, and
    whether the first row is marked as a header (``<th>`` cells or ``<thead>``).

    Spans are clamped to :data:`MAX_SPAN`; a cell spanning rows is kept once per column (the
    last row it covers), not once per covered cell; every cell is counted in ``budget``
    before it is placed."""
    soup = BeautifulSoup(html, "html.parser")
    table = soup.find("table")
    if table is None:
        return [], False
    rows: list[list[str]] = []
    carried: dict[int, tuple[int, str]] = {}  # column -> (last row it covers, value)
    header_marked = False
    for r, tr in enumerate(table.find_all("tr")):
        if tr.find_parent("table") is not table:
            continue
        row: list[str] = []
        cells = tr.find_all(["td", "th"], recursive=False)
        if r == 0 and cells:
            header_marked = tr.find_parent("thead") is not None or all(
                c.name == "th" for c in cells
            )
        at = len(rows)
        col = _take_carried(row, carried, at, 0, budget, index)
        for cell in cells:
            value = collapse_ws(cell.get_text(" "))
            colspan, rowspan = _span(cell.get("colspan")), _span(cell.get("rowspan"))
            budget.take(colspan, colspan * len(value), index)
            for c in range(colspan):
                row.append(value)
                if rowspan > 1:
                    carried[col + c] = (at + rowspan - 1, value)
            col = _take_carried(row, carried, at, col + colspan, budget, index)
        rows.append(row)
    return rows, header_marked


def _take_carried(
    row: list[str],
    carried: dict[int, tuple[int, str]],
    at: int,
    col: int,
    budget: _TableBudget,
    index: int,
) -> int:
    """Append to ``row`` (row number ``at``) the carried cells from column ``col`` on, up to the
    first column no span covers; returns that column."""
    while col in carried:
        last, value = carried[col]
        if last < at:  # a span that ended above this row (the row under it was shorter)
            del carried[col]
            break
        budget.take(1, len(value), index)
        row.append(value)
        if last == at:
            del carried[col]
        col += 1
    return col


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
