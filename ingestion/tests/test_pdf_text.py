"""PDF text paths: glyphs of fonts without a Unicode mapping never reach a chunk as ``(cid:N)``
or as wrong letters, and pages that draw only text skip the layout (table and image) pass with
the same text.

Real PDFs: a composite font with an Identity encoding and no ``/ToUnicode`` written with pypdf
(pdfminer then yields ``(cid:N)`` and pypdf unrelated letters), and reportlab documents.
"""

from __future__ import annotations

import io

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import (
    ArrayObject,
    DictionaryObject,
    NameObject,
    NumberObject,
    StreamObject,
    TextStringObject,
)
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.platypus import Paragraph, SimpleDocTemplate

from ingestion.compilation.pipeline import run_job
from ingestion.documents import admit_document
from ingestion.models import Document, KnowledgeNode
from ingestion.parsing import parse_with_report
from ingestion.parsing.pdf_parser import _needs_layout
from knowledgefs.testing.pdf_fixtures import text_pdf

PDF = "application/pdf"
N = NameObject


def _unmapped_font_pdf(content: bytes) -> bytes:
    """One page whose ``/F0`` is a Type0 font, ``/Identity-H``, no ``/ToUnicode`` and no font
    program (its glyph ids name no characters); ``/F1`` is Helvetica."""
    writer = PdfWriter()
    page = writer.add_blank_page(612, 792)
    info = {N("/Registry"): TextStringObject("Adobe"), N("/Ordering"): TextStringObject("Identity")}
    info[N("/Supplement")] = NumberObject(0)
    descendant = DictionaryObject(
        {N("/Type"): N("/Font"), N("/Subtype"): N("/CIDFontType2"), N("/BaseFont"): N("/Unmapped"),
         N("/CIDSystemInfo"): DictionaryObject(info), N("/DW"): NumberObject(600)}
    )  # fmt: skip
    type0 = DictionaryObject(
        {N("/Type"): N("/Font"), N("/Subtype"): N("/Type0"), N("/BaseFont"): N("/Unmapped"),
         N("/Encoding"): N("/Identity-H"),
         N("/DescendantFonts"): ArrayObject([writer._add_object(descendant)])}
    )  # fmt: skip
    helvetica = DictionaryObject(
        {N("/Type"): N("/Font"), N("/Subtype"): N("/Type1"), N("/BaseFont"): N("/Helvetica")}
    )
    fonts = {N("/F0"): writer._add_object(type0), N("/F1"): writer._add_object(helvetica)}
    page[N("/Resources")] = DictionaryObject({N("/Font"): DictionaryObject(fonts)})
    stream = StreamObject()
    stream.set_data(content)
    page[N("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


_GRID = b"""
72 600 m 372 600 l S 72 580 m 372 580 l S 72 560 m 372 560 l S 72 540 m 372 540 l S
72 600 m 72 540 l S 222 600 m 222 540 l S 372 600 m 372 540 l S
BT /F1 12 Tf 77 585 Td (Name) Tj ET BT /F1 12 Tf 227 585 Td (Value) Tj ET
BT /F1 12 Tf 77 565 Td (alpha) Tj ET BT /F0 12 Tf 227 565 Td <00030044> Tj ET
BT /F1 12 Tf 77 545 Td (beta) Tj ET BT /F1 12 Tf 227 545 Td (two) Tj ET
"""
_PARAGRAPHS = b"""
BT /F1 12 Tf 72 740 Td (Readable paragraph before the table) Tj ET
BT /F0 12 Tf 72 710 Td <0003002B00480044> Tj ET
"""


def _all_text(report) -> str:
    parts = []
    for element in report.elements:
        parts.append(element.text)
        for row in [element.metadata.get("header") or [], *element.metadata.get("rows", [])]:
            parts.extend(row)
    return "\n".join(parts)


def test_unmapped_glyphs_in_table_cells_and_paragraphs_are_dropped_with_a_warning():
    data = _unmapped_font_pdf(_PARAGRAPHS + _GRID)
    # The input really is the fault: pdfminer yields (cid:N), pypdf unrelated letters.
    import pdfplumber

    with pdfplumber.open(io.BytesIO(data)) as pdf:
        assert "(cid:3)" in pdf.pages[0].extract_text()
    assert "+HD" in PdfReader(io.BytesIO(data)).pages[0].extract_text()

    report = parse_with_report(data, PDF)
    text = _all_text(report)
    assert "(cid:" not in text
    assert "+HD" not in text and "\x03" not in text
    assert "Readable paragraph before the table" in text
    tables = [e for e in report.elements if e.type == "table"]
    assert len(tables) == 1
    assert tables[0].metadata["header"] == ["Name", "Value"]
    assert tables[0].metadata["rows"] == [["alpha", ""], ["beta", "two"]]
    assert report.warnings == [
        "page 1: 8 glyphs without a Unicode mapping (font without ToUnicode) dropped from its text"
    ]


def test_unmapped_glyphs_on_a_page_without_graphics_are_dropped_too():
    report = parse_with_report(_unmapped_font_pdf(_PARAGRAPHS), PDF)
    assert [e.text for e in report.elements] == ["Readable paragraph before the table"]
    assert report.warnings == [
        "page 1: 4 glyphs without a Unicode mapping (font without ToUnicode) dropped from its text"
    ]


@pytest.mark.django_db
def test_a_compiled_pdf_with_unmapped_glyphs_has_no_cid_in_its_chunks(space):
    data = _unmapped_font_pdf(_PARAGRAPHS + _GRID)
    admission = admit_document(space, filename="unmapped.pdf", data=data, enqueue=False)
    run_job(admission.job.id)
    document = Document.objects.get(id=admission.document.id)
    assert document.state == "published"
    texts = list(KnowledgeNode.objects.filter(document=document).values_list("text", flat=True))
    assert texts and all("(cid:" not in t and "+HD" not in t for t in texts)
    assert any("Readable paragraph" in t for t in texts)


# --- the layout pass only where a page draws something besides text ------------------------------


def _report_pdf(paragraphs: int) -> bytes:
    style = getSampleStyleSheet()["BodyText"]
    words = "retrieval compiles every knowledge space into chunks with citations".split()
    story = [
        Paragraph(" ".join(words[(i + j) % len(words)] for j in range(50)) + f" ({i}).", style)
        for i in range(paragraphs)
    ]
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4).build(story)
    return buffer.getvalue()


def test_pages_that_draw_only_text_skip_the_layout_pass_and_others_do_not():
    text_only = PdfReader(io.BytesIO(_report_pdf(30))).pages
    assert len(text_only) > 2
    assert not any(_needs_layout(page) for page in text_only)
    grid = PdfReader(io.BytesIO(_unmapped_font_pdf(b"BT /F1 12 Tf 72 700 Td (x) Tj ET" + _GRID)))
    assert _needs_layout(grid.pages[0])
    # "(S)" and "(re)" shown as text are no drawing operators.
    shown = text_pdf([["S", "re f Do BI"]])
    assert not _needs_layout(PdfReader(io.BytesIO(shown)).pages[0])


def test_a_text_only_pdf_parses_to_the_same_text_as_pypdf_page_by_page():
    data = _report_pdf(30)
    report = parse_with_report(data, PDF)
    by_page: dict[int, list[str]] = {}
    for element in report.elements:
        assert element.type == "paragraph"
        by_page.setdefault(element.page_number, []).append(element.text)
    reader = PdfReader(io.BytesIO(data))
    assert sorted(by_page) == list(range(1, len(reader.pages) + 1))
    for number, page in enumerate(reader.pages, start=1):
        assert " ".join(by_page[number]).split() == page.extract_text().split()
    assert report.warnings == []
