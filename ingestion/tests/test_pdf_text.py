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
from ingestion.parsing.pdf_content import needs_layout
from knowledgefs.testing.fixtures import shared_path
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


_DROPPED = (
    "page 1: {} words or table cells dropped: they hold glyphs without a Unicode mapping "
    "(font without ToUnicode)"
)


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
    assert report.warnings == [_DROPPED.format(2)]


def test_unmapped_glyphs_on_a_page_without_graphics_are_dropped_too():
    report = parse_with_report(_unmapped_font_pdf(_PARAGRAPHS), PDF)
    assert [e.text for e in report.elements] == ["Readable paragraph before the table"]
    assert report.warnings == [_DROPPED.format(1)]


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
    assert not any(needs_layout(page) for page in text_only)
    grid = PdfReader(io.BytesIO(_unmapped_font_pdf(b"BT /F1 12 Tf 72 700 Td (x) Tj ET" + _GRID)))
    assert needs_layout(grid.pages[0])
    # "(S)" and "(re)" shown as text are no drawing operators.
    shown = text_pdf([["S", "re f Do BI"]])
    assert not needs_layout(PdfReader(io.BytesIO(shown)).pages[0])


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


def _math_minus_pdf(table: bool) -> bytes:
    """A simple font whose ``/Differences`` name code 3 ``/C0`` (a math font's minus, as in the
    sample journal page), its ``/ToUnicode`` covering other codes only: "\x030.94" shows
    "-0.94"."""
    writer = PdfWriter()
    page = writer.add_blank_page(612, 792)
    cmap = StreamObject()
    cmap.set_data(
        b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /M def "
        b"1 begincodespacerange <00> <ff> endcodespacerange 1 beginbfchar <41> <0041> "
        b"endbfchar endcmap CMapName currentdict /CMap defineresource pop end end"
    )
    encoding = DictionaryObject(
        {N("/Type"): N("/Encoding"), N("/Differences"): ArrayObject([NumberObject(3), N("/C0")])}
    )
    math = DictionaryObject(
        {N("/Type"): N("/Font"), N("/Subtype"): N("/Type1"), N("/BaseFont"): N("/MathSymbols"),
         N("/Encoding"): writer._add_object(encoding), N("/ToUnicode"): writer._add_object(cmap)}
    )  # fmt: skip
    helvetica = DictionaryObject(
        {N("/Type"): N("/Font"), N("/Subtype"): N("/Type1"), N("/BaseFont"): N("/Helvetica")}
    )
    fonts = {N("/F0"): writer._add_object(math), N("/F1"): writer._add_object(helvetica)}
    page[N("/Resources")] = DictionaryObject({N("/Font"): DictionaryObject(fonts)})
    content = b"BT /F1 12 Tf 72 740 Td (Potential of the sample:) Tj ET "
    content += b"BT /F0 12 Tf 72 720 Td <03> Tj /F1 12 Tf (0.9393 V measured) Tj ET"
    if table:
        content += _GRID
    stream = StreamObject()
    stream.set_data(content)
    page[N("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize("table", [False, True])
def test_a_math_fonts_unnamed_minus_never_leaves_a_wrong_value(table):
    data = _math_minus_pdf(table)
    assert "/C00.9393" in PdfReader(io.BytesIO(data)).pages[0].extract_text()  # pypdf's output
    report = parse_with_report(data, PDF)
    text = _all_text(report)
    assert "0.9393" not in text and "/C0" not in text and "(cid:" not in text
    assert "Potential of the sample:" in text and "V measured" in text


def test_the_sample_journal_table_has_no_cid_and_no_unsigned_potentials():
    data = shared_path("data", "sample-docs", "embedded-images-tables.pdf").read_bytes()
    report = parse_with_report(data, PDF)
    text = _all_text(report)
    assert "(cid:" not in text and "/C0" not in text
    assert "0.9393" not in text  # printed "−0.9393": its minus has no Unicode mapping
    table = next(e for e in report.elements if e.type == "table")
    assert "Ecorr(V)" in table.metadata["header"]
    column = table.metadata["header"].index("Ecorr(V)")
    assert [row[column] for row in table.metadata["rows"]] == [""] * 6
    assert table.metadata["rows"][0][:3] == ["0", "0.0335", "0.0409"]
    assert report.warnings == [_DROPPED.format(6)]
