"""PPTX parser: python-pptx, one slide after another (titles, text, tables, pictures, notes)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from typing import Any

import pptx
from pptx.enum.shapes import MSO_SHAPE_TYPE, PP_PLACEHOLDER

from .archive import admit_zip, unsafe_entry_warnings
from .base import MAX_ASSETS, Asset, Element, ParseReport, collapse_ws, image_asset, image_mime_type
from .errors import CorruptDocument
from .tables import render_table

_CORRUPT = "corrupt or unreadable PPTX"
_TITLE_TYPES = {PP_PLACEHOLDER.TITLE, PP_PLACEHOLDER.CENTER_TITLE, PP_PLACEHOLDER.VERTICAL_TITLE}
_BODY_TYPES = {PP_PLACEHOLDER.BODY, PP_PLACEHOLDER.OBJECT, PP_PLACEHOLDER.VERTICAL_BODY}
#: Placeholders that repeat on every slide and carry no content of their own.
_SKIP_TYPES = {PP_PLACEHOLDER.DATE, PP_PLACEHOLDER.SLIDE_NUMBER}
_MAX_GROUP_DEPTH = 32


def _placeholder_type(shape: Any) -> Any:
    if not getattr(shape, "is_placeholder", False):
        return None
    try:
        return shape.placeholder_format.type
    except ValueError:  # a placeholder element without a readable type
        return None


def _walk(shapes: Any, depth: int = 0) -> Iterator[Any]:
    """Shapes in z-order, looking into grouped shapes (bounded nesting)."""
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP and depth < _MAX_GROUP_DEPTH:
            yield from _walk(shape.shapes, depth + 1)
        else:
            yield shape


def _paragraphs(text_frame: Any) -> list[tuple[int, str]]:
    """(indent level, text) of the non-empty paragraphs of a text frame."""
    out = []
    for paragraph in text_frame.paragraphs:
        text = collapse_ws("".join(run.text for run in paragraph.runs) or paragraph.text or "")
        if text:
            out.append((int(paragraph.level or 0), text))
    return out


def _table(shape: Any) -> tuple[str, dict] | None:
    """Rendered table of a graphic frame. Merged cells as for DOCX and XLSX (BC-07): a merge
    spanning several rows has its text in its first column on every row it covers; the other
    columns it covers (``is_spanned``) are empty, so its text appears once per row. The first
    row is the header when the table marks it (``first_row``, PowerPoint's default) and it has
    at least two non-empty cells."""
    table = shape.table
    rows = []
    carried: dict[tuple[int, int], str] = {}  # (row, column) covered by a vertical merge
    for r, row in enumerate(table.rows):
        values = []
        for c, cell in enumerate(row.cells):
            if cell.is_spanned:
                values.append(carried.get((r, c), ""))
                continue
            text = collapse_ws(cell.text)
            values.append(text)
            if cell.is_merge_origin:
                for below in range(r + 1, r + cell.span_height):
                    carried[(below, c)] = text
        rows.append(values)
    rows = [r for r in rows if any(r)]
    if not rows:
        return None
    first = rows[0]
    if table.first_row and len(rows) > 1 and sum(1 for c in first if c) >= 2:
        return render_table(first, rows[1:])
    return render_table(None, rows)


def _chart_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.15g}" if isinstance(value, float) else collapse_ws(str(value))


def _image_partname(shape: Any) -> str:
    """Package name of a picture's image part, e.g. ``"ppt/media/image1.png"``, or ``""``."""
    try:
        part = shape.part.related_part(shape._element.blip_rId)
        return str(part.partname).lstrip("/")
    except Exception:  # noqa: BLE001 - the name is cosmetic
        return ""


class _SlideWalker:
    def __init__(self) -> None:
        self.out: list[Element] = []
        self.assets: list[Asset] = []
        self.seen_images: set[str] = set()
        self.images_over_cap = 0
        self.hidden = False
        self.hidden_slides: list[int] = []

    def emit(self, type_: str, text: str, number: int, path: tuple[str, ...], **kw: Any) -> None:
        if self.hidden:
            kw["metadata"] = {**kw.get("metadata", {}), "hidden_slide": True}
        if text.strip():
            self.out.append(
                Element(type=type_, text=text, page_number=number, section_path=path, **kw)
            )

    def picture(self, shape: Any, number: int) -> None:
        try:
            image = shape.image
            blob = image.blob
        except Exception:  # noqa: BLE001 - a linked or broken picture: skip it
            return
        digest = hashlib.sha256(blob).hexdigest()
        if digest in self.seen_images:
            return
        self.seen_images.add(digest)
        if len(self.assets) >= MAX_ASSETS:
            self.images_over_cap += 1
            return
        mime = image_mime_type(blob, image.filename or "") or image.content_type
        name = _image_partname(shape) or f"slide{number}/{shape.name}"
        self.assets.append(image_asset(blob, mime, str(name), page_number=number))

    def chart(self, shape: Any, number: int, path: tuple[str, ...]) -> None:
        """A category chart's title as a paragraph and its data as a table (one row per
        category, one column per series); other chart kinds contribute their title only."""
        try:
            chart = shape.chart
            title = collapse_ws(chart.chart_title.text_frame.text) if chart.has_title else ""
            plots = list(chart.plots)
            categories = [collapse_ws(str(c)) for c in plots[0].categories] if plots else []
            series = [(collapse_ws(s.name or ""), list(s.values)) for p in plots for s in p.series]
        except Exception:  # noqa: BLE001 - an unusual chart part: keep the rest of the slide
            return
        self.emit("paragraph", title, number, path)
        if not categories or not series:
            return
        header = ["Category"] + [name or f"series {i}" for i, (name, _) in enumerate(series, 1)]
        rows = [
            [category]
            + [_chart_value(values[i]) if i < len(values) else "" for _, values in series]
            for i, category in enumerate(categories)
        ]
        text, meta = render_table(header, rows)
        self.emit("table", text, number, path, metadata=meta)

    def text_frame(self, shape: Any, number: int, path: tuple[str, ...]) -> None:
        paragraphs = _paragraphs(shape.text_frame)
        if not paragraphs:
            return
        body = _placeholder_type(shape) in _BODY_TYPES
        if body and len(paragraphs) > 1:
            lines = [f"{'  ' * level}- {text}" for level, text in paragraphs]
            self.emit("list", "\n".join(lines), number, path)
        else:
            self.emit("paragraph", "\n".join(text for _, text in paragraphs), number, path)

    def slide(self, slide: Any, number: int) -> None:
        # <p:sld show="0">: hidden in the slide show, still part of the deck.
        self.hidden = slide._element.get("show") in ("0", "false")
        if self.hidden:
            self.hidden_slides.append(number)
        title_shape = None
        for shape in slide.placeholders:
            if _placeholder_type(shape) in _TITLE_TYPES and shape.has_text_frame:
                title_shape = shape
                break
        title = collapse_ws(title_shape.text_frame.text) if title_shape is not None else ""
        path: tuple[str, ...] = (title,) if title else ()
        if title:
            self.emit("heading", title, number, path, level=1)
        for shape in _walk(slide.shapes):
            if title_shape is not None and shape.shape_id == title_shape.shape_id:
                continue
            if _placeholder_type(shape) in _SKIP_TYPES:
                continue
            if getattr(shape, "has_table", False) and shape.has_table:
                rendered = _table(shape)
                if rendered is not None:
                    self.emit("table", rendered[0], number, path, metadata=rendered[1])
            elif getattr(shape, "has_chart", False) and shape.has_chart:
                self.chart(shape, number, path)
            elif shape.shape_type == MSO_SHAPE_TYPE.PICTURE or hasattr(shape, "image"):
                self.picture(shape, number)
            elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
                self.text_frame(shape, number, path)
        if slide.has_notes_slide:
            frame = slide.notes_slide.notes_text_frame
            notes = "\n".join(t for _, t in _paragraphs(frame)) if frame is not None else ""
            self.emit("paragraph", notes, number, path, metadata={"part": "notes"})


def parse_pptx(data: bytes) -> ParseReport:
    """Parse PPTX bytes slide by slide.

    Per slide (``page_number`` = 1-based slide number, used for citations): the title
    placeholder becomes a level-1 ``"heading"`` and the slide's ``section_path`` is
    ``(title,)`` (empty for an untitled slide); other shapes follow in z-order, grouped shapes
    included: body placeholders with several paragraphs become one ``"list"`` (``"- item"``
    lines indented by two spaces per level), other text (subtitles, text boxes) a
    ``"paragraph"``; tables a ``"table"`` (first row as header when the table marks it;
    merged cells once); charts their title and, for category charts, a ``"table"`` of the
    data (``Category`` and one column per series); pictures ``Asset(kind="image",
    page_number=slide)`` (each distinct
    image once, at most :data:`~ingestion.parsing.base.MAX_ASSETS`); speaker notes a
    ``"paragraph"`` with ``metadata={"part": "notes"}``. Date and slide-number placeholders
    are skipped; connectors and other shapes without text contribute nothing. A hidden slide
    (``show="0"``) is indexed like the others, its elements tagged
    ``metadata["hidden_slide"] = True``, and named in the warnings.

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        CorruptDocument: "corrupt or unreadable PPTX".
    """
    summary = admit_zip(data, "PPTX")
    try:
        presentation = pptx.Presentation(io.BytesIO(data))
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    walker = _SlideWalker()
    for number, slide in enumerate(presentation.slides, start=1):
        walker.slide(slide, number)
    warnings = unsafe_entry_warnings(summary) + [
        f"slide {number} is hidden; it was indexed and tagged hidden_slide"
        for number in walker.hidden_slides
    ]
    if walker.images_over_cap:
        warnings.append(
            f"{walker.images_over_cap} images beyond the limit of {MAX_ASSETS} were not kept"
        )
    return ParseReport(
        elements=walker.out,
        page_count=None,
        pages_without_text=[],
        parser="python-pptx",
        assets=walker.assets,
        warnings=warnings,
    )
