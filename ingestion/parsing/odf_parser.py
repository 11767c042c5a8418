"""OpenDocument parser (ODT, ODS, ODP): the package's ``content.xml`` read with lxml.

ODF is a ZIP package whose ``mimetype`` entry names the kind and whose ``content.xml`` holds
the body; it is plain, documented XML (OASIS OpenDocument 1.3), so lxml reads it directly
(no entity expansion, no network) without a further library. Tables follow the grid: repeated
cells and rows (``number-columns-repeated``/``number-rows-repeated``, bounded), spans
(``number-columns-spanned``/``number-rows-spanned``: a vertical span's text carried to every
row it covers, a horizontal one once) and covered cells keep every column position.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from lxml import etree

from .archive import admit_zip, unsafe_entry_warnings, zip_images
from .base import MAX_ASSETS, Element, ParseReport, SectionStack, collapse_ws
from .errors import CorruptDocument, EncryptedDocument
from .tables import render_table
from .xlsx_parser import NOT_CALCULATED, _sheet_elements, looks_like_header

ODT = "application/vnd.oasis.opendocument.text"
ODS = "application/vnd.oasis.opendocument.spreadsheet"
ODP = "application/vnd.oasis.opendocument.presentation"
_LABELS = {ODT: "ODT", ODS: "ODS", ODP: "ODP"}

_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_DRAW = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
_PRES = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
_STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
_XLINK = "http://www.w3.org/1999/xlink"
_MANIFEST = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"


def _t(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


_P, _H, _SPAN, _S, _TAB, _BR = (_t(_TEXT, n) for n in ("p", "h", "span", "s", "tab", "line-break"))
_LIST, _ITEM, _HEADER_ITEM = (_t(_TEXT, n) for n in ("list", "list-item", "list-header"))
_NOTE, _NOTE_CITATION = _t(_TEXT, "note"), _t(_TEXT, "note-citation")
_SECTION_LIKE = {_t(_TEXT, n) for n in ("section", "index-body", "table-of-content")} | {
    _t(_TEXT, "illustration-index"),
    _t(_TEXT, "alphabetical-index"),
}
_TBL, _ROW, _CELL, _COVERED = (
    _t(_TABLE, n) for n in ("table", "table-row", "table-cell", "covered-table-cell")
)
_ROW_GROUPS = {
    _t(_TABLE, n)
    for n in ("table-header-rows", "table-rows", "table-row-group", "table-header-columns")
}
_FRAME, _TEXT_BOX, _GROUP, _PAGE, _IMAGE = (
    _t(_DRAW, n) for n in ("frame", "text-box", "g", "page", "image")
)
_NOTES = _t(_PRES, "notes")
#: Left out of a paragraph's text: note marks, tracked deletions, comments, and drawing
#: frames (a text box anchored in the paragraph is walked as blocks of its own).
_SKIPPED_TEXT = {
    _NOTE_CITATION,
    _t(_TEXT, "tracked-changes"),
    _t(_OFFICE, "annotation"),
    _FRAME,
    _GROUP,
    _t(_DRAW, "custom-shape"),
}

#: Bounds on repeated cells and rows, so a sheet declaring 16,384 repeated columns or
#: 1,048,576 repeated rows (LibreOffice writes both for formatted empty areas) stays small.
MAX_COLUMNS = 1024
MAX_ROW_REPEAT = 1000
MAX_ROWS = 100_000
_MAX_DEPTH = 64


def _int(node: Any, ns: str, name: str, default: int = 1) -> int:
    try:
        return max(int(node.get(_t(ns, name), default)), 1)
    except (TypeError, ValueError):
        return default


def inline_text(node: Any, depth: int = 0) -> str:
    """Text of a paragraph-like element: spans, ``text:s`` (``c`` spaces), tabs and line
    breaks; note citations, tracked deletions and annotations are left out; a footnote's body
    follows its anchor in brackets."""
    parts: list[str] = [node.text or ""] if node.tag != _NOTE else []
    for child in node:
        tag = child.tag
        if tag == _S:
            parts.append(" " * min(_int(child, _TEXT, "c"), 100))
        elif tag == _TAB:
            parts.append("\t")
        elif tag == _BR:
            parts.append("\n")
        elif tag == _NOTE and depth < _MAX_DEPTH:
            body = " ".join(inline_text(p, depth + 1) for p in child.iter(_P))
            parts.append(f" [{collapse_ws(body)}]" if body.strip() else "")
        elif tag not in _SKIPPED_TEXT and isinstance(tag, str) and depth < _MAX_DEPTH:
            parts.append(inline_text(child, depth + 1))
        parts.append(child.tail or "")
    return "".join(parts)


def _cell_text(cell: Any) -> str:
    """Displayed text of a table cell (its paragraphs); a formula cell with no displayed and
    no stored value is its formula marked :data:`NOT_CALCULATED`."""
    texts = [collapse_ws(inline_text(p)) for p in cell.iter(_P, _H)]
    text = collapse_ws(" ".join(t for t in texts if t))
    if text:
        return text
    formula = cell.get(_t(_TABLE, "formula"))
    value = cell.get(_t(_OFFICE, "value")) or cell.get(_t(_OFFICE, "string-value"))
    if value:
        return collapse_ws(value)
    if formula:
        shown = formula.split(":", 1)[1] if formula.startswith("of:") else formula
        return f"{shown if shown.startswith('=') else '=' + shown} {NOT_CALCULATED}"
    return ""


def _rows(table: Any) -> Any:
    """``table:table-row`` elements of a table in order, through row groups."""
    for child in table:
        if child.tag == _ROW:
            yield child
        elif child.tag in _ROW_GROUPS:
            yield from _rows(child)


def table_grid(table: Any) -> tuple[list[list[str]], bool]:
    """Cell texts per row on the table's grid, and whether a bound was hit.

    Repeated cells are expanded up to :data:`MAX_COLUMNS` columns and repeated rows up to
    :data:`MAX_ROW_REPEAT` copies (empty repeated rows count once: they are dropped later);
    a cell spanning rows carries its text to the same column of every row it covers, the
    other columns it covers stay ``""``. Trailing empty cells and rows are trimmed.
    """
    grid: list[list[str]] = []
    carried: dict[tuple[int, int], str] = {}
    clipped = False
    for row in _rows(table):
        cells: list[str] = []
        r = len(grid)
        for cell in row:
            if cell.tag not in (_CELL, _COVERED):
                continue
            repeat = _int(cell, _TABLE, "number-columns-repeated")
            text = _cell_text(cell) if cell.tag == _CELL else ""
            for _ in range(repeat):
                c = len(cells)
                if c >= MAX_COLUMNS:
                    clipped = clipped or bool(text)
                    break
                if cell.tag == _COVERED:
                    cells.append(carried.get((r, c), ""))
                    continue
                cells.append(text)
                for below in range(1, min(_int(cell, _TABLE, "number-rows-spanned"), 1000)):
                    carried[(r + below, c)] = text
        while cells and not cells[-1]:
            cells.pop()
        repeat = _int(row, _TABLE, "number-rows-repeated")
        copies = 1 if not cells else min(repeat, MAX_ROW_REPEAT)
        clipped = clipped or (bool(cells) and repeat > MAX_ROW_REPEAT)
        for _ in range(copies):
            if len(grid) >= MAX_ROWS:
                return _trim(grid), True
            grid.append(list(cells))
    return _trim(grid), clipped


def _trim(grid: list[list[str]]) -> list[list[str]]:
    while grid and not any(grid[-1]):
        grid.pop()
    width = max((len(r) for r in grid), default=0)
    return [r + [""] * (width - len(r)) for r in grid]


def _render(table: Any) -> tuple[str, dict] | None:
    rows = [r for r in table_grid(table)[0] if any(r)]
    if not rows:
        return None
    marked = table.find(_t(_TABLE, "table-header-rows")) is not None
    if len(rows) > 1 and (marked or looks_like_header(rows[0], rows[1:])):
        return render_table(rows[0], rows[1:])
    return render_table(None, rows)


class _Walker:
    """Reading-order walk of an ODT body or of the text frames of an ODP slide."""

    def __init__(self) -> None:
        self.out: list[Element] = []
        self.sections = SectionStack()
        self.page: int | None = None
        self.extra: dict = {}

    def emit(self, type_: str, text: str, metadata: dict | None = None, **kw: Any) -> None:
        text = text.strip()
        if text:
            meta = {**(metadata or {}), **self.extra}
            self.out.append(
                Element(
                    type=type_,
                    text=text,
                    section_path=self.sections.path,
                    page_number=self.page,
                    metadata=meta,
                    **kw,
                )
            )

    def list_lines(self, node: Any, level: int, lines: list[str]) -> None:
        for item in node:
            if item.tag not in (_ITEM, _HEADER_ITEM):
                continue
            for child in item:
                if child.tag in (_P, _H):
                    text = collapse_ws(inline_text(child))
                    if text:
                        lines.append(f"{'  ' * level}- {text}")
                elif child.tag == _LIST and level < _MAX_DEPTH:
                    self.list_lines(child, level + 1, lines)

    def block(self, node: Any, depth: int = 0) -> None:
        for child in node:
            tag = child.tag
            if tag == _H:
                text = collapse_ws(inline_text(child))
                if text:
                    level = min(_int(child, _TEXT, "outline-level"), 6)
                    self.sections.push(level, text)
                    self.emit("heading", text, level=level)
            elif tag == _P:
                self.emit("paragraph", inline_text(child))
                if depth < _MAX_DEPTH:
                    for frame in _outer_frames(child):  # text boxes anchored here
                        self.block([frame], depth + 1)
            elif tag == _LIST:
                lines: list[str] = []
                self.list_lines(child, 0, lines)
                self.emit("list", "\n".join(lines))
            elif tag == _TBL:
                rendered = _render(child)
                if rendered is not None:
                    self.emit("table", rendered[0], rendered[1])
            elif isinstance(tag, str) and (tag.startswith(f"{{{_DRAW}}}") or tag in _SECTION_LIKE):
                if depth < _MAX_DEPTH:  # frames, text boxes, groups, shapes, sections
                    self.block(child, depth + 1)


def _outer_frames(paragraph: Any) -> list[Any]:
    """Drawing frames and shapes anchored in ``paragraph``, outermost only (their own
    paragraphs are walked as blocks, where nested frames are found in turn)."""
    found = []
    for node in paragraph.iter(_FRAME, _GROUP, _t(_DRAW, "custom-shape")):
        ancestor = node.getparent()
        while ancestor is not None and ancestor is not paragraph:
            if ancestor.tag in (_FRAME, _GROUP, _t(_DRAW, "custom-shape")):
                break
            ancestor = ancestor.getparent()
        else:
            found.append(node)
    return found


def _content(zf: zipfile.ZipFile, names: set[str], label: str) -> Any:
    if "META-INF/manifest.xml" in names:
        manifest = _xml(zf, "META-INF/manifest.xml", label)
        if manifest.find(f".//{{{_MANIFEST}}}encryption-data") is not None:
            raise EncryptedDocument(f"encrypted {label}, password required")
    if "content.xml" not in names:
        raise CorruptDocument(f"corrupt or unreadable {label}: content.xml is missing")
    return _xml(zf, "content.xml", label)


def _xml(zf: zipfile.ZipFile, name: str, label: str) -> Any:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
    try:
        return etree.fromstring(zf.read(name), parser)
    except (etree.XMLSyntaxError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CorruptDocument(f"corrupt or unreadable {label}: {name} is damaged") from exc


def _hidden_table_styles(root: Any) -> set[str]:
    """Automatic table styles with ``table:display="false"`` (hidden sheets)."""
    hidden = set()
    for style in root.iter(_t(_STYLE, "style")):
        props = style.find(_t(_STYLE, "table-properties"))
        if props is not None and props.get(_t(_TABLE, "display")) == "false":
            hidden.add(style.get(_t(_STYLE, "name")))
    return hidden


def _spreadsheet(body: Any, root: Any) -> tuple[list[Element], list[str]]:
    hidden_styles = _hidden_table_styles(root)
    out: list[Element] = []
    notes: list[str] = []
    for sheet in body.iter(_TBL):
        if sheet.getparent() is None or sheet.getparent().tag != _t(_OFFICE, "spreadsheet"):
            continue
        title = collapse_ws(sheet.get(_t(_TABLE, "name")) or "") or "Sheet"
        grid, clipped = table_grid(sheet)
        used = [i for i in range(len(grid[0]) if grid else 0) if any(r[i] for r in grid)]
        rows = [[r[i] for i in used] for r in grid if any(r)]
        state = "hidden" if sheet.get(_t(_TABLE, "style-name")) in hidden_styles else "visible"
        if state == "hidden":
            notes.append(f"sheet {title!r} is hidden; it was indexed and tagged hidden")
        if clipped:
            notes.append(f"sheet {title!r}: repeated cells or rows beyond the limits were cut")
        if any(NOT_CALCULATED in c for r in rows for c in r):
            notes.append(f"sheet {title!r}: formulas without a value are marked {NOT_CALCULATED}")
        if rows:
            out.extend(_sheet_elements(title, rows, state))
    return out, notes


def _presentation(body: Any) -> tuple[list[Element], list[str]]:
    walker = _Walker()
    notes: list[str] = []
    for number, page in enumerate(body.iter(_PAGE), start=1):
        hidden = page.get(_t(_PRES, "visibility")) == "hidden"
        walker.page, walker.extra = number, ({"hidden_slide": True} if hidden else {})
        walker.sections = SectionStack()
        if hidden:
            notes.append(f"slide {number} is hidden; it was indexed and tagged hidden_slide")
        for frame in page:
            if frame.get(_t(_PRES, "class")) == "title":
                title = collapse_ws(" ".join(inline_text(p) for p in frame.iter(_P)))
                if title:
                    walker.sections.push(1, title)
                    walker.emit("heading", title, level=1)
                continue
            if frame.tag == _NOTES:
                text = "\n".join(collapse_ws(inline_text(p)) for p in frame.iter(_P))
                walker.emit("paragraph", text, {"part": "notes"})
                continue
            walker.block([frame])
    return walker.out, notes


def parse_odf(data: bytes, mime_type: str) -> ParseReport:
    """Parse an ODT, ODS or ODP package.

    ODT: headings (``text:h``, level from ``outline-level``) as section paths, paragraphs,
    lists (``"- item"`` lines, two spaces per level), tables (first row the header when the
    table has header rows or its first row is ≥ 2 non-numeric cells), text boxes after their
    anchor paragraph, footnote bodies in brackets after their anchor. ODS: like XLSX, one
    level-1 heading per sheet, title rows, header detection and tables of 20 rows; a formula
    cell with no value ``"=… (not calculated)"``; hidden sheets indexed with
    ``metadata["sheet_state"] = "hidden"``, named in the warnings. ODP: per slide
    (``page_number``), the title frame a heading, text frames, groups and tables, speaker notes
    ``{"part": "notes"}``, a hidden slide tagged ``hidden_slide`` and named in the warnings.
    Pictures under ``Pictures/`` become image assets.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        EncryptedDocument: (code ``encrypted_document``) the package is password-protected.
        CorruptDocument: "corrupt or unreadable ODT" (ODS, ODP).
    """
    label = _LABELS[mime_type]
    summary = admit_zip(data, label)
    names = set(summary.names)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise CorruptDocument(f"corrupt or unreadable {label}") from exc
    with zf:
        root = _content(zf, names, label)
    body = root.find(_t(_OFFICE, "body"))
    kind = {ODT: "text", ODS: "spreadsheet", ODP: "presentation"}[mime_type]
    content = body.find(_t(_OFFICE, kind)) if body is not None else None
    if content is None:
        raise CorruptDocument(f"corrupt or unreadable {label}: no office:{kind} body")
    warnings = unsafe_entry_warnings(summary)
    if mime_type == ODS:
        elements, notes = _spreadsheet(content, root)
    elif mime_type == ODP:
        elements, notes = _presentation(content)
    else:
        walker = _Walker()
        walker.block(content)
        elements, notes = walker.out, []
    pictures = [n for n in summary.names if n.startswith("Pictures/") and not n.endswith("/")]
    assets, over = zip_images(data, pictures)
    warnings += notes
    if over:
        warnings.append(f"{over} images beyond the limit of {MAX_ASSETS} were not kept")
    return ParseReport(
        elements=elements,
        page_count=None,
        pages_without_text=[],
        parser="native-odf",
        assets=assets,
        warnings=warnings,
    )


def parse_odt(data: bytes) -> ParseReport:
    return parse_odf(data, ODT)


def parse_ods(data: bytes) -> ParseReport:
    return parse_odf(data, ODS)


def parse_odp(data: bytes) -> ParseReport:
    return parse_odf(data, ODP)
