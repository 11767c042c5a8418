"""DOCX parser: python-docx, body walked in document order (paragraphs and tables)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import docx
from docx.oxml.ns import qn

from .archive import admit_zip, unsafe_entry_warnings, zip_images
from .base import MAX_ASSETS, Element, ParseReport, SectionStack, collapse_ws
from .errors import CorruptDocument
from .remote_refs import unfetched_image_warnings
from .tables import render_row, render_table

_CORRUPT = "corrupt or unreadable DOCX"
_W_P = qn("w:p")
_W_TBL = qn("w:tbl")
_W_TR = qn("w:tr")
_W_TC = qn("w:tc")
_W_TXBX = qn("w:txbxContent")
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
_MAX_BOX_DEPTH = 8
_CONTAINERS = {qn("w:sdt"), qn("w:sdtContent"), qn("w:customXml")}
_HEADING_RE = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)
_NUMBER_RE = re.compile(r"^[\s$€£%()+\-.,\d]+$")
_RUN_XPATH = (
    "./w:r | ./w:hyperlink/w:r | ./w:ins/w:r | ./w:smartTag/w:r | ./w:fldSimple/w:r"
    " | ./w:sdt/w:sdtContent/w:r | ./w:customXml/w:r | ./w:hyperlink/w:ins/w:r"
)


def _blocks(parent: Any) -> Iterator[Any]:
    """Yield ``w:p`` and ``w:tbl`` elements under ``parent`` in order, looking through
    content controls (``w:sdt``) and custom XML wrappers."""
    for child in parent.iterchildren():
        tag = child.tag
        if not isinstance(tag, str):  # comments, processing instructions
            continue
        if tag in (_W_P, _W_TBL):
            yield child
        elif tag in _CONTAINERS:
            yield from _blocks(child)


def _para_text(p: Any) -> str:
    return "".join(r.text for r in p.xpath(_RUN_XPATH)).strip()


def _text_boxes(p: Any) -> list[Any]:
    """Outermost text boxes (``w:txbxContent``) anchored in paragraph ``p``, skipping the
    VML copy Word keeps under ``mc:Fallback`` (so a box's text is read once)."""
    boxes = []
    for box in p.iter(_W_TXBX):
        ancestor = box.getparent()
        while ancestor is not None and ancestor is not p:
            if ancestor.tag in (_MC_FALLBACK, _W_TXBX):
                break
            ancestor = ancestor.getparent()
        else:
            boxes.append(box)
    return boxes


def _style_name(p: Any, styles_element: Any) -> str:
    """Name of the paragraph's style (``"Normal"`` when unset; the style id when unknown)."""
    ppr = p.pPr
    style_id = ppr.pStyle.val if ppr is not None and ppr.pStyle is not None else None
    if style_id is None:
        return "Normal"
    style = styles_element.get_by_id(style_id)
    name = style.name_val if style is not None else None
    return str(name or style_id)


def _is_list(p: Any, style: str) -> bool:
    ppr = p.pPr
    has_num = ppr is not None and ppr.numPr is not None
    return has_num or style.lower().startswith("list")


def _row_cells(tr: Any) -> Iterator[Any]:
    """``w:tc`` elements of a row in order (looking through content controls); a
    horizontally merged cell is one ``w:tc`` with a ``gridSpan``, so it appears once."""
    for child in tr.iterchildren():
        if not isinstance(child.tag, str):
            continue
        if child.tag == _W_TC:
            yield child
        elif child.tag in _CONTAINERS:
            yield from _row_cells(child)


def _cell_text(tc: Any) -> str:
    parts: list[str] = []
    for block in _blocks(tc):
        if block.tag == _W_P:
            parts.append(_para_text(block))
        else:
            nested = [render_row(None, row, positional=True) for row in _table_rows(block)]
            parts.append("; ".join(r for r in nested if r))
    return collapse_ws(" ".join(p for p in parts if p))


def _vmerge_continue(tc: Any) -> bool:
    tcpr = tc.tcPr
    if tcpr is None:
        return False
    vmerge = tcpr.find(qn("w:vMerge"))
    return vmerge is not None and vmerge.get(qn("w:val")) in (None, "continue")


def _grid_before(tr: Any) -> int:
    """Grid columns skipped before the row's first cell (``w:trPr/w:gridBefore``)."""
    node = tr.find(f"{qn('w:trPr')}/{qn('w:gridBefore')}")
    try:
        return max(int(node.get(qn("w:val"))), 0) if node is not None else 0
    except (TypeError, ValueError):
        return 0


def _grid_after(tr: Any) -> int:
    """Grid columns left empty after the row's last cell (``w:trPr/w:gridAfter``)."""
    node = tr.find(f"{qn('w:trPr')}/{qn('w:gridAfter')}")
    try:
        return min(max(int(node.get(qn("w:val"))), 0), 64) if node is not None else 0
    except (TypeError, ValueError):
        return 0


def _table_rows(tbl: Any) -> list[list[str]]:
    """Cell texts per row, one entry per grid column, so every row lines up with the header.

    The grid is followed exactly: ``gridBefore``/``gridAfter`` leave their columns ``""``; a
    horizontally merged cell (``gridSpan``) gives its text to its first grid column and ``""``
    to the others (its text is never repeated in the row); a vertically merged cell (``vMerge``
    continue) carries the text of the merge above it in the same grid column to every row it
    covers, as XLSX merges are (case BC-07). The text above a column is remembered across rows
    that do not reach that column (a ``gridBefore``/``gridAfter`` row between the start and the
    continuation), so a merge is never lost. Rows are padded to the widest row.
    """
    rows: list[list[str]] = []
    above: dict[int, str] = {}  # grid column -> text of the cell last seen covering it
    for tr in tbl.iterchildren(_W_TR):
        col = min(_grid_before(tr), 64)
        row: list[str] = [""] * col
        for tc in _row_cells(tr):
            span = max(min(int(getattr(tc, "grid_span", 1) or 1), 64), 1)
            text = above.get(col, "") if _vmerge_continue(tc) else _cell_text(tc)
            row.append(text)
            row.extend([""] * (span - 1))
            for covered in range(col, col + span):
                above[covered] = text
            col += span
        row.extend([""] * _grid_after(tr))
        rows.append(row)
    width = max((len(r) for r in rows), default=0)
    return [r + [""] * (width - len(r)) for r in rows]


def _is_header_row(tbl: Any, rows: list[list[str]]) -> bool:
    """Heuristic: the first row is a header when marked ``tblHeader``, or when it has ≥2
    short, distinct, non-numeric, non-empty cells and most body rows have as many cells."""
    if len(rows) < 2:
        return False
    first_tr = next(tbl.iterchildren(_W_TR), None)
    if first_tr is not None and first_tr.find(f"{qn('w:trPr')}/{qn('w:tblHeader')}") is not None:
        return True
    first = rows[0]
    if len(first) < 2 or any(not c or len(c) > 60 or _NUMBER_RE.match(c) for c in first):
        return False
    if len(set(first)) != len(first):
        return False
    same = sum(1 for r in rows[1:] if len(r) == len(first))
    return same >= max(1, (len(rows) - 1) * 0.8)


class _DocxWalker:
    def __init__(self, document: Any) -> None:
        self.document = document
        self.styles = document.styles.element
        self.sections = SectionStack()
        self.out: list[Element] = []
        self.list_items: list[str] = []

    def emit(self, type_: str, text: str, **kwargs: Any) -> None:
        text = text.strip()
        if text:
            self.out.append(
                Element(type=type_, text=text, section_path=self.sections.path, **kwargs)
            )

    def flush_list(self) -> None:
        if self.list_items:
            self.emit("list", "\n".join(f"- {item}" for item in self.list_items))
            self.list_items = []

    def paragraph(self, p: Any, depth: int = 0) -> None:
        self.paragraph_text(p)
        if depth < _MAX_BOX_DEPTH:
            for box in _text_boxes(p):
                for block in _blocks(box):
                    if block.tag == _W_P:
                        self.paragraph(block, depth + 1)
                    else:
                        self.table(block)

    def paragraph_text(self, p: Any) -> None:
        text = _para_text(p)
        if not text:
            return
        style = _style_name(p, self.styles)
        heading = _HEADING_RE.match(style)
        if style.lower() != "title" and not heading and _is_list(p, style):
            self.list_items.append(collapse_ws(text))
            return
        self.flush_list()
        if style.lower() == "title":
            self.emit("title", text)
        elif heading:
            level = min(max(int(heading.group(1)), 1), 6)
            title = collapse_ws(text)
            self.sections.push(level, title)
            self.emit("heading", title, level=level)
        else:
            self.emit("paragraph", text)

    def table(self, tbl: Any) -> None:
        self.flush_list()
        rows = [r for r in _table_rows(tbl) if any(r)]
        if not rows:
            return
        if _is_header_row(tbl, rows):
            text, meta = render_table(rows[0], rows[1:])
        else:
            text, meta = render_table(None, rows)
        self.emit("table", text, metadata=meta)

    def body(self) -> None:
        for block in _blocks(self.document.element.body):
            if block.tag == _W_P:
                self.paragraph(block)
            else:
                self.table(block)
        self.flush_list()

    def headers_footers(self) -> None:
        seen: set[tuple[str, str]] = set()
        for section in self.document.sections:
            parts = [
                ("header", section.header),
                ("header", section.first_page_header),
                ("header", section.even_page_header),
                ("footer", section.footer),
                ("footer", section.first_page_footer),
                ("footer", section.even_page_footer),
            ]
            for kind, part in parts:
                if part.is_linked_to_previous:
                    continue
                lines = []
                for block in _blocks(part._element):
                    if block.tag == _W_P:
                        lines.append(_para_text(block))
                    else:
                        rows = _table_rows(block)
                        lines.extend(render_row(None, r, positional=True) for r in rows)
                text = "\n".join(line for line in lines if line)
                if text and (kind, text) not in seen:
                    seen.add((kind, text))
                    self.out.append(Element(type="paragraph", text=text, metadata={"part": kind}))


def _media_names(names: tuple[str, ...]) -> list[str]:
    """Entries under ``word/media/`` (every picture of the body, headers and footers)."""
    return [n for n in names if n.startswith("word/media/") and not n.endswith("/")]


def _linked_images(document: Any) -> list[str]:
    """Targets of pictures linked to an external URL instead of embedded (never fetched)."""
    urls = []
    for part in document.part.package.iter_parts():
        for rel in part.rels.values():
            if rel.is_external and rel.reltype.endswith("/image"):
                urls.append(rel.target_ref)
    return urls


def parse_docx(data: bytes) -> ParseReport:
    """Parse DOCX bytes into title/heading/paragraph/list/table elements and image assets.

    The container passes :func:`~ingestion.parsing.archive.admit_zip` first. Paragraph styles:
    "Title" -> ``"title"``, "Heading N" -> ``"heading"`` (level N, capped at 6);
    numbered/bulleted or "List*"-styled paragraphs are merged into one ``"list"`` element per
    run of consecutive items (lines ``"- item"``). Tables become one ``"table"`` element each
    (``header: value`` rows when the first row looks like a header, else ``" | "``-joined
    cells; metadata ``{"header": ..., "rows": [[...]]}``; merged cells as in
    :func:`_table_rows`; a nested table's rows are rendered inside its cell as
    ``"a | b; c | d"``). Text boxes follow the paragraph they are anchored in (once, not
    again from their VML fallback). Non-empty header/footer texts are appended once at the end as
    paragraphs with ``metadata={"part": "header"|"footer"}``. Every picture under
    ``word/media/`` (body, headers, floating) becomes an ``Asset(kind="image")`` named by its
    entry, at most :data:`~ingestion.parsing.base.MAX_ASSETS`. A picture linked to an external
    URL is never fetched (:mod:`~ingestion.parsing.remote_refs`): a warning lists it;
    hyperlinks keep their text and are never followed.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        CorruptDocument: "corrupt or unreadable DOCX".
    """
    summary = admit_zip(data, "DOCX")
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    walker = _DocxWalker(document)
    walker.body()
    walker.headers_footers()
    assets, over = zip_images(data, _media_names(summary.names))
    warnings = unsafe_entry_warnings(summary)
    if over:
        warnings.append(f"{over} images beyond the limit of {MAX_ASSETS} were not kept")
    warnings += unfetched_image_warnings(_linked_images(document))
    return ParseReport(
        elements=walker.out,
        page_count=None,
        pages_without_text=[],
        parser="python-docx",
        assets=assets,
        warnings=warnings,
    )
