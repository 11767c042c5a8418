"""HTML parser: BeautifulSoup + lxml, walked in document order."""

from __future__ import annotations

import re
import warnings
from typing import Any

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

try:  # bs4 >= 4.11
    from bs4 import XMLParsedAsHTMLWarning
except ImportError:  # pragma: no cover - older bs4
    XMLParsedAsHTMLWarning = UserWarning  # type: ignore[misc,assignment]

from .base import Element, ParseReport, SectionStack, collapse_ws
from .markup_encoding import decode_markup
from .remote_refs import unfetched_image_warnings
from .tables import render_row, render_table

_DROP = {
    "script",
    "style",
    "noscript",
    "template",
    "head",
    "svg",
    "canvas",
    "iframe",
    "object",
    "embed",
    "select",
}
#: Page furniture, not body text: navigation anywhere; a header or footer of the page (not
#: one inside an article, section, aside or main, which belongs to that content, nor a header
#: holding an ``<h1>``, the page's title; its navigation still goes); and the
#: ARIA landmarks of the same blocks (HTML-AAM: ``header`` maps to ``banner`` and ``footer`` to
#: ``contentinfo`` only outside sectioning content and ``main``).
_NAV_ROLES = frozenset({"navigation", "banner", "contentinfo"})
_PAGE_LEVEL_ONLY = frozenset({"header", "footer"})
_SECTIONING = frozenset({"article", "aside", "main", "nav", "section"})
_BOILERPLATE_MARK = "data-kfs-boilerplate"
_HEADINGS = {f"h{i}": i for i in range(1, 7)}
_PARAGRAPH_LIKE = {
    "p",
    "blockquote",
    "dt",
    "dd",
    "figcaption",
    "caption",
    "summary",
    "address",
    "li",
    "legend",
}
_BLOCK = {
    "article",
    "aside",
    "body",
    "center",
    "details",
    "dialog",
    "div",
    "dl",
    "fieldset",
    "figure",
    "footer",
    "form",
    "header",
    "hgroup",
    "html",
    "main",
    "menu",
    "nav",
    "section",
    "tbody",
    "thead",
    "tfoot",
    "tr",
    "td",
    "th",
    "hr",
}
_SEPARATING = _BLOCK | _PARAGRAPH_LIKE | set(_HEADINGS) | {"pre", "ul", "ol", "table", "br"}
_SKIP_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
#: Widest ``colspan`` honoured (HTML Living Standard: "colspan ... greater than zero and less
#: than or equal to 1000"); larger values are clipped.
MAX_COLSPAN = 1000
#: Most cells the spans of one table may add to its grid (a hostile ``colspan``/``rowspan``
#: cannot make the parser allocate without bound); once spent, cells count as unspanned.
MAX_SPAN_CELLS = 1_000_000

# A DOCTYPE with an internal subset; quoted strings may contain "]" or ">".
_DTD_SUBSET_RE = re.compile(
    r"<!DOCTYPE\s+([^\[>]*?)\s*\[(?:[^\]\"']|\"[^\"]*\"|'[^']*')*\]\s*>", re.IGNORECASE
)
_LANG_RE = re.compile(r"^(?:language|lang)-(.+)$")


def _inline_text(node: Tag, exclude: frozenset[str] = frozenset()) -> str:
    """Text of ``node`` with block boundaries as spaces, whitespace collapsed."""
    parts: list[str] = []

    def visit(tag: Tag) -> None:
        for child in tag.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, _SKIP_STRINGS):
                    parts.append(str(child))
            elif isinstance(child, Tag):
                name = (child.name or "").lower()
                if name in exclude or name in _DROP:
                    continue
                if name in _SEPARATING:
                    parts.append(" ")
                    visit(child)
                    parts.append(" ")
                else:
                    visit(child)

    visit(node)
    return collapse_ws("".join(parts))


def _span(cell: Tag, name: str, limit: int) -> int:
    """The cell's ``colspan``/``rowspan`` clipped to ``1..limit``; ``rowspan="0"`` (HTML: to
    the end of the table section) and junk count as ``limit`` and 1 respectively."""
    raw = str(cell.get(name) or "1").strip()
    try:
        value = int(raw)
    except ValueError:
        return 1
    if value == 0 and name == "rowspan":
        return limit
    return min(max(value, 1), limit)


class _SpanGrid:
    """Lays table rows out on a grid honouring ``colspan`` and ``rowspan``.

    A cell spanning several rows has its text repeated in its column on every row it covers
    (like merged DOCX/XLSX cells, BC-07); a cell spanning several columns has its text once,
    the covered columns are blank. Spans are clipped: ``colspan`` to :data:`MAX_COLSPAN`,
    ``rowspan`` to the rows left in the table, and spans stop adding cells once
    :data:`MAX_SPAN_CELLS` have been added.
    """

    def __init__(self, row_count: int) -> None:
        self.row_count = row_count
        self.pending: dict[int, tuple[str, int]] = {}  # column -> (text, last row covered)
        self.budget = MAX_SPAN_CELLS

    def _carried(self, index: int, col: int) -> str | None:
        held = self.pending.get(col)
        if held is None or held[1] < index:
            self.pending.pop(col, None)
            return None
        return held[0]

    def row(self, index: int, cells: list[Tag]) -> list[str]:
        """Values of row ``index`` (0-based) from its ``td``/``th`` cells."""
        values: list[str] = []
        for cell in cells:
            while (carried := self._carried(index, len(values))) is not None:
                values.append(carried)
            text = _inline_text(cell)
            colspan = _span(cell, "colspan", MAX_COLSPAN)
            rowspan = _span(cell, "rowspan", max(self.row_count - index, 1))
            if (colspan - 1) + (rowspan - 1) * colspan > self.budget:
                colspan = rowspan = 1
            self.budget -= (colspan - 1) + (rowspan - 1) * colspan
            for offset in range(colspan):
                if rowspan > 1:
                    self.pending[len(values)] = (text if offset == 0 else "", index + rowspan - 1)
                values.append(text if offset == 0 else "")
        for col in sorted(c for c in self.pending if c >= len(values)):
            carried = self._carried(index, col)
            if carried is not None:
                values.extend([""] * (col - len(values)))
                values.append(carried)
        return values


def _direct(tag: Tag, names: set[str]) -> list[Tag]:
    return [c for c in tag.children if isinstance(c, Tag) and (c.name or "").lower() in names]


def _is_boilerplate(tag: Tag) -> bool:
    name = (tag.name or "").lower()
    roles = str(tag.get("role") or "").lower().split()
    if name == "nav" or _NAV_ROLES.intersection(roles):
        return True
    if name not in _PAGE_LEVEL_ONLY:
        return False
    if name == "header" and tag.find("h1") is not None:
        return False  # it holds the page's title (an EPUB chapter's, a post's): content
    return not any((p.name or "").lower() in _SECTIONING for p in tag.parents)


def mark_boilerplate(root: Tag) -> int:
    """Mark the outermost navigation, page header and page footer blocks of ``root`` (see
    :data:`_NAV_ROLES`) with :data:`_BOILERPLATE_MARK`; return how many were marked."""
    marked = 0
    for tag in root.find_all(True):
        if _is_boilerplate(tag) and tag.find_parent(attrs={_BOILERPLATE_MARK: True}) is None:
            tag[_BOILERPLATE_MARK] = "1"
            marked += 1
    return marked


#: A block repeated in at least this many documents of one archive, and in at least half of
#: them, is page furniture (a running header, a "previous | next" bar, a copyright line).
REPEATED_BLOCK_MIN_DOCUMENTS = 3
_REPEATED_BLOCK_MAX_CHARS = 300


def drop_repeated_blocks(documents: list[list[Element]]) -> list[list[Element]]:
    """The documents of one archive (EPUB spine files) without the short paragraphs and lists
    repeated in most of them (:data:`REPEATED_BLOCK_MIN_DOCUMENTS`); a document that would be
    left without text keeps its blocks."""
    seen: dict[str, int] = {}
    for elements in documents:
        for text in {e.text for e in elements if _repeatable(e)}:
            seen[text] = seen.get(text, 0) + 1
    threshold = max(REPEATED_BLOCK_MIN_DOCUMENTS, (len(documents) + 1) // 2)
    repeated = {text for text, n in seen.items() if n >= threshold}
    if not repeated:
        return documents
    out = []
    for elements in documents:
        kept = [e for e in elements if not (_repeatable(e) and e.text in repeated)]
        out.append(kept if any(e.type != "title" for e in kept) else elements)
    return out


def _repeatable(element: Element) -> bool:
    return element.type in ("paragraph", "list") and len(element.text) <= _REPEATED_BLOCK_MAX_CHARS


class _HtmlWalker:
    def __init__(self, sections: SectionStack | None = None) -> None:
        self.out: list[Element] = []
        self.sections = sections if sections is not None else SectionStack()
        self.buf: list[str] = []
        self.skip_boilerplate = False

    def emit(self, type_: str, text: str, **kwargs: Any) -> None:
        if text.strip():
            self.out.append(
                Element(type=type_, text=text.strip(), section_path=self.sections.path, **kwargs)
            )

    def flush(self) -> None:
        text = collapse_ws("".join(self.buf))
        self.buf = []
        self.emit("paragraph", text)

    def walk(self, node: Tag) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, _SKIP_STRINGS):
                    self.buf.append(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = (child.name or "").lower()
            if name in _DROP or (self.skip_boilerplate and child.has_attr(_BOILERPLATE_MARK)):
                continue
            if name in _HEADINGS:
                self.flush()
                text = _inline_text(child)
                if text:
                    self.sections.push(_HEADINGS[name], text)
                    self.emit("heading", text, level=_HEADINGS[name])
            elif name == "pre":
                self.flush()
                self.code(child)
            elif name in ("ul", "ol"):
                self.flush()
                self.emit("list", "\n".join(self.list_lines(child, 0)))
            elif name == "table":
                self.flush()
                self.table(child)
            elif name == "br":
                self.buf.append(" ")
            elif name in _PARAGRAPH_LIKE or name in _BLOCK:
                self.flush()
                self.walk(child)
                self.flush()
            else:
                self.walk(child)

    def code(self, pre: Tag) -> None:
        classes = list(pre.get("class") or [])
        inner = pre.find("code")
        if isinstance(inner, Tag):
            classes += list(inner.get("class") or [])
        language = next((m.group(1) for c in classes if (m := _LANG_RE.match(c))), None)
        for dropped in pre.find_all(list(_DROP)):
            dropped.extract()
        lines = [line.rstrip() for line in pre.get_text().split("\n")]
        while lines and not lines[0].strip():
            lines.pop(0)
        text = "\n".join(lines).rstrip()
        self.emit("code", text, metadata={"language": language} if language else {})

    def list_lines(self, lst: Tag, depth: int) -> list[str]:
        lines: list[str] = []
        ordered = (lst.name or "").lower() == "ol"
        number = 0
        for child in lst.children:
            if not isinstance(child, Tag):
                text = collapse_ws(str(child)) if not isinstance(child, _SKIP_STRINGS) else ""
                if text:
                    lines.append("  " * depth + text)
                continue
            name = (child.name or "").lower()
            if name in _DROP:
                continue
            if name == "li":
                number += 1
                own = _inline_text(child, exclude=frozenset({"ul", "ol"}))
                if own:
                    bullet = f"{number}." if ordered else "-"
                    lines.append(f"{'  ' * depth}{bullet} {own}")
                for nested in child.find_all(["ul", "ol"]):
                    if nested.find_parent("li") is child:  # direct sub-list of this item
                        lines.extend(self.list_lines(nested, depth + 1))
            elif name in ("ul", "ol"):
                lines.extend(self.list_lines(child, depth + 1))
            else:
                lines.extend(self.list_lines(child, depth))
        return lines

    def table(self, table: Tag) -> None:
        if table.find(list(_HEADINGS) + ["table", "ul", "ol", "pre"]):
            # Layout table: walk its cells as ordinary blocks.
            self.walk(table)
            return
        rows: list[list[str]] = []
        header: list[str] | None = None
        header_done = False
        trs = [tr for tr in table.find_all("tr") if tr.find_parent("table") is table]
        grid = _SpanGrid(len(trs))
        for index, tr in enumerate(trs):
            cells = _direct(tr, {"td", "th"})
            values = grid.row(index, cells)
            if not any(values):
                continue
            in_thead = tr.find_parent("thead") is not None
            all_th = bool(cells) and all((c.name or "").lower() == "th" for c in cells)
            if not header_done and not rows and (in_thead or all_th):
                header = values
                header_done = True
                continue
            header_done = True
            rows.append(values)
        caption = table.find("caption")
        if isinstance(caption, Tag):
            self.emit("paragraph", _inline_text(caption))
        non_empty = [sum(1 for v in r if v) for r in rows]
        if header is None and (len(rows) <= 1 or max(non_empty, default=0) <= 1):
            # A one-row or one-column table is layout, not data: emit its text as paragraphs.
            for r in rows:
                self.emit("paragraph", render_row(None, r))
            return
        text, meta = render_table(header, rows)
        self.emit("table", text, metadata=meta)


def parse_html_report(data: bytes) -> ParseReport:
    """Parse an HTML document (parser ``"native-html"``): :func:`parse_html`'s elements with
    the decoder's warnings (a declared charset overruled by the content, an encoding detected
    with low confidence, invalid UTF-8 bytes replaced) and one per image, which stays a
    reference (never fetched, :mod:`~ingestion.parsing.remote_refs`).

    Raises:
        EncodingError: (``undetectable_encoding``) no declared or detected encoding gives
            plausible text.
    """
    decoded = decode_markup(data)
    images: list[str] = []
    return ParseReport(
        elements=_parse_text(decoded.text, None, images),
        page_count=None,
        pages_without_text=[],
        parser="native-html",
        warnings=[*decoded.warnings, *unfetched_image_warnings(images)],
    )


def parse_html(data: bytes, sections: SectionStack | None = None) -> list[Element]:
    """Parse HTML bytes into title/heading/paragraph/list/code/table elements.

    Drops script/style/noscript/template/head content (also inside ``<pre>``) and page
    furniture: ``<nav>``, the page's ``<header>`` (unless it holds the ``<h1>``) and
    ``<footer>`` (not those of an article or section) and ``role="navigation"``/
    ``"banner"``/``"contentinfo"`` blocks, unless they hold all the page's text; a non-empty
    ``<title>`` becomes a ``"title"`` element first, unless the first heading repeats it.
    Text directly inside divs (not in ``<p>``) is kept as paragraphs. The bytes are decoded by
    :func:`~ingestion.parsing.markup_encoding.decode_markup` (BOM, a declared charset weighed
    against the content, then scored detection), never by BeautifulSoup's guess.
    ``sections`` continues the heading stack of a previous document (EPUB chapters split
    across files); it is updated in place. A DOCTYPE's internal subset (``<!DOCTYPE html [
    <!ENTITY ...> ]>``, common in XHTML chapters of EPUBs) is removed before parsing: the HTML
    parser would end the DOCTYPE at its first ``>`` and leave the rest as text; its entities
    are never expanded (a reference to one stays as written).

    Raises:
        EncodingError: see :func:`parse_html_report`.
    """
    return _parse_text(decode_markup(data).text, sections)


def _parse_text(
    text: str, sections: SectionStack | None, images: list[str] | None = None
) -> list[Element]:
    """Elements of decoded HTML; the page's image URLs (``img src``, ``srcset``, never
    fetched) are appended to ``images`` when given."""
    text = _DTD_SUBSET_RE.sub(r"<!DOCTYPE \1>", text, count=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(text, "lxml")
    if images is not None:
        for tag in soup.find_all(["img", "source"]):
            images.extend(str(tag.get("src") or "").split()[:1])
            images.extend(
                c.split()[0] for c in str(tag.get("srcset") or "").split(",") if c.split()
            )
    walker = _HtmlWalker(sections)
    title = soup.find("title")
    if isinstance(title, Tag):
        walker.emit("title", collapse_ws(title.get_text()))
    root = soup.body if isinstance(soup.body, Tag) else soup
    try:
        walker.skip_boilerplate = mark_boilerplate(root) > 0
        start = (len(walker.out), walker.sections.snapshot())
        walker.walk(root)
        walker.flush()
        if walker.skip_boilerplate and len(walker.out) == start[0]:
            # Nothing but page furniture: that is the page's content, keep it.
            walker.sections.restore(start[1])
            walker.skip_boilerplate = False
            walker.walk(root)
            walker.flush()
    except RecursionError:
        # Pathologically deep nesting: fall back to flat text (bs4 iterates without recursion).
        for tag in root.find_all(list(_DROP)):
            tag.extract()
        walker.out = walker.out[:1] if walker.out and walker.out[0].type == "title" else []
        walker.sections = sections if sections is not None else SectionStack()
        for line in root.get_text("\n").split("\n"):
            walker.emit("paragraph", collapse_ws(line))
    return _without_repeated_title(walker.out)


def _without_repeated_title(elements: list[Element]) -> list[Element]:
    """Drop the ``<title>`` element when the page's first heading says the same (an ``<h1>``
    equal to it up to case and whitespace): the text is indexed once, as the heading."""
    if not elements or elements[0].type != "title":
        return elements
    heading = next((e for e in elements[1:] if e.type == "heading"), None)
    if heading is not None and heading.text.casefold() == elements[0].text.casefold():
        return elements[1:]
    return elements
