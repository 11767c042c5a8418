"""Native parsers of every non-PDF format, content sniffing and upload-time refusals.

Sample documents come from ``../shared/data/sample-docs`` (tests skip with a reason when the
folder is absent); the cases BC-05, BC-07 and BC-09 (``../shared/cases/README.md``) and the
damaged/hostile inputs are built by the tests themselves.
"""

from __future__ import annotations

import io
import random
import struct
import time
import zipfile
from email.message import EmailMessage

import docx
import openpyxl
import pptx
import pytest
from PIL import Image
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.util import Inches

from ingestion.parsing import (
    ArchiveRejected,
    ContentMismatch,
    CorruptDocument,
    EncodingError,
    ParseError,
    ParseReport,
    ProtectedDocument,
    UnsupportedType,
    parse_with_report,
    sniff_mime_type,
)
from knowledgefs.testing.fixtures import shared_path, upload

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
EPUB = "application/epub+zip"
EML = "message/rfc822"
MSG = "application/vnd.ms-outlook"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- helpers ----------------------------------------------------------------------------------


def sample(name: str) -> bytes:
    return shared_path("data", "sample-docs", name).read_bytes()


def parse_named(data: bytes, name: str) -> ParseReport:
    """Sniff like an upload does, then parse."""
    return parse_with_report(data, sniff_mime_type(data, name))


def parse_sample(name: str) -> ParseReport:
    return parse_named(sample(name), name)


def all_text(report: ParseReport) -> str:
    return "\n".join(e.text for e in report.elements)


def find(report: ParseReport, fragment: str):
    """The first element whose text contains ``fragment`` (fails when there is none)."""
    for element in report.elements:
        if fragment in element.text:
            return element
    raise AssertionError(f"{fragment!r} not in any element")


def png_bytes(color: str = "red", size: tuple[int, int] = (8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def zip_bytes(entries: dict[str, bytes | str], *, stored_first: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        if stored_first is not None:
            zf.writestr(stored_first, entries[stored_first], compress_type=zipfile.ZIP_STORED)
        for name, content in entries.items():
            if name != stored_first:
                zf.writestr(name, content)
    return buf.getvalue()


def zip_bomb(inner: str = "word/document.xml", mib: int = 300) -> bytes:
    """``mib`` MiB of zeros deflated into one entry (about 0.3 MB on disk)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", "<Types/>")
        with zf.open(inner, "w") as fh:
            chunk = b"\x00" * (1024 * 1024)
            for _ in range(mib):
                fh.write(chunk)
    return buf.getvalue()


# -- DOCX ---------------------------------------------------------------------------------------


def test_docx_tables_sample_cells_nested_and_merged() -> None:
    report = parse_sample("docx-tables.docx")
    tables = [e for e in report.elements if e.type == "table"]
    assert len(tables) == 3
    assert tables[0].text.split("\n")[2] == "| Lorem ipsum | A link example |"
    assert tables[0].metadata["header"] == ["Header Col 1", "Header Col 2"]
    nested = tables[1]
    assert nested.metadata["header"] == ["a", ">b<", "c"]
    assert nested.text.split("\n")[2] == "| d | e \\| f; g&t \\| h | i |"
    merged = tables[2]
    # a spans rows 1-2 (vertical: carried), b spans 2 columns (horizontal: once), d rows 2-3.
    assert merged.metadata["rows"] == [["a", "b", ""], ["a", "c", "d"], ["e", "", "d"]]
    assert merged.text == "a | b\na | c | d\ne |  | d"  # d stays in the third column
    assert find(report, "Table with merged cells").type == "paragraph"


def test_docx_pictures_become_assets() -> None:
    report = parse_sample("contains-pictures.docx")
    assert sorted(a.name for a in report.assets) == [
        "word/media/image1.png",
        "word/media/image2.png",
        "word/media/image3.png",
    ]
    assert all(a.kind == "image" and a.mime_type == "image/png" for a in report.assets)
    assert all(a.data.startswith(PNG_MAGIC) for a in report.assets)
    assert sorted(len(a.data) for a in report.assets) == [3739, 6111, 64276]
    assert all(a.width and a.height for a in report.assets)
    assert "An inline picture appears here" in all_text(report)
    header = find(report, "An inline picture in the header.")
    assert header.metadata == {"part": "header"}
    assert parse_sample("fake.docx").elements[0].text == "Lorem ipsum dolor sit amet."


def test_docx_merged_header_cells_keep_columns_aligned() -> None:
    document = docx.Document()
    table = document.add_table(rows=3, cols=3)
    for c, value in enumerate(["Region", "Q1", "Q2"]):
        table.cell(0, c).text = value
    table.cell(1, 0).merge(table.cell(2, 0)).text = "North"
    table.cell(1, 1).text = "10"
    table.cell(1, 2).text = "11"
    table.cell(2, 1).merge(table.cell(2, 2)).text = "both quarters"
    buf = io.BytesIO()
    document.save(buf)
    element = next(e for e in parse_named(buf.getvalue(), "t.docx").elements if e.type == "table")
    assert element.text.split("\n")[2:] == [
        "| North | 10 | 11 |",
        "| North | both quarters |  |",
    ]


TEXT_BOX_RUN = (
    '<w:r xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
    'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006">'
    '<mc:AlternateContent><mc:Choice Requires="wps"><w:drawing><w:txbxContent>'
    "<w:p><w:r><w:t>TEXTBOX-88 inside a shape</w:t></w:r></w:p></w:txbxContent></w:drawing>"
    "</mc:Choice><mc:Fallback><w:pict><w:txbxContent>"
    "<w:p><w:r><w:t>TEXTBOX-88 inside a shape</w:t></w:r></w:p></w:txbxContent></w:pict>"
    "</mc:Fallback></mc:AlternateContent></w:r>"
)


def test_docx_text_box_read_once() -> None:
    from lxml import etree

    document = docx.Document()
    anchor = document.add_paragraph("Before the box.")
    anchor._p.append(etree.fromstring(TEXT_BOX_RUN))
    document.add_paragraph("After the box.")
    buf = io.BytesIO()
    document.save(buf)
    texts = [e.text for e in parse_named(buf.getvalue(), "box.docx").elements]
    assert texts == ["Before the box.", "TEXTBOX-88 inside a shape", "After the box."]


# -- PPTX ---------------------------------------------------------------------------------------


def test_pptx_samples_slides_lists_text_boxes_and_tables() -> None:
    fake = parse_sample("fake-power-point.pptx")
    heading = fake.elements[0]
    assert (heading.type, heading.text, heading.page_number, heading.level) == (
        "heading",
        "Adding a Bullet Slide",
        1,
        1,
    )
    bullets = find(fake, "Find the bullet slide layout")
    assert bullets.type == "list" and "  - Use _TextFrame.text for first bullet" in bullets.text
    box = find(fake, "Here is some text in a text box!")
    assert (box.page_number, box.section_path) == (1, ("Adding a Bullet Slide",))

    deck = parse_sample("sample-presentation.pptx")
    assert find(deck, "With a subtitle").page_number == 1
    sub = find(deck, "This one is a sub-sub-bullet")
    assert (sub.page_number, sub.section_path) == (2, ("This is the first content slide",))
    assert find(deck, "Sub-details 2").page_number == 3
    table = next(e for e in deck.elements if e.type == "table")
    assert table.page_number == 4
    assert table.section_path == ("This is kinda backwards, huh?",)
    assert table.metadata["rows"][2] == ["2", "A2", "B2", "C2"]
    assert "1 | A1 | B1 | C1" in table.text
    assert deck.parser == "python-pptx"


def make_pptx() -> bytes:
    deck = pptx.Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    first.shapes.title.text = "Budget 2026"
    body = first.placeholders[1].text_frame
    body.text = "Travel"
    body.add_paragraph().text = "Hardware"
    body.paragraphs[1].level = 1
    first.notes_slide.notes_text_frame.text = "Speaker note: mention the NOTE-4471 freeze"
    second = deck.slides.add_slide(deck.slide_layouts[5])
    second.shapes.title.text = "Numbers"
    group = second.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(1), Inches(2), Inches(1)).text = "GROUPED-7Q"
    frame = second.shapes.add_table(3, 3, Inches(1), Inches(3), Inches(6), Inches(2))
    cells = frame.table
    for c, value in enumerate(["Team", "Budget", "Owner"]):
        cells.cell(0, c).text = value
    cells.cell(1, 0).text = "Ops"
    cells.cell(1, 1).text = "120"
    cells.cell(1, 2).text = "Ana"
    cells.cell(2, 0).text = "Sales"
    cells.cell(2, 1).merge(cells.cell(2, 2))
    cells.cell(2, 1).text = "shared 80"
    second.shapes.add_picture(io.BytesIO(png_bytes()), Inches(5), Inches(1))
    third = deck.slides.add_slide(deck.slide_layouts[5])
    third.shapes.title.text = "Trend"
    data = CategoryChartData()
    data.categories = ["Q1", "Q2"]
    data.add_series("Revenue", (10.0, 12.5))
    data.add_series("Cost", (7, 8))
    graphic = third.shapes.add_chart(
        XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(1), Inches(6), Inches(4), data
    )
    graphic.chart.has_title = True
    graphic.chart.chart_title.text_frame.text = "Revenue by quarter"
    buf = io.BytesIO()
    deck.save(buf)
    return buf.getvalue()


def test_pptx_notes_groups_merged_tables_charts_and_pictures() -> None:
    report = parse_named(make_pptx(), "budget.pptx")
    notes = find(report, "NOTE-4471")
    assert notes.metadata == {"part": "notes"}
    assert (notes.page_number, notes.section_path) == (1, ("Budget 2026",))
    assert find(report, "Travel").text == "- Travel\n  - Hardware"
    grouped = find(report, "GROUPED-7Q")
    assert (grouped.page_number, grouped.section_path) == (2, ("Numbers",))
    table = next(e for e in report.elements if e.type == "table")
    assert table.metadata["header"] == ["Team", "Budget", "Owner"]
    assert table.text.split("\n")[2:] == [
        "| Ops | 120 | Ana |",
        "| Sales | shared 80 |  |",
    ]
    assert [(a.kind, a.mime_type, a.page_number, a.width, a.height) for a in report.assets] == [
        ("image", "image/png", 2, 8, 6)
    ]
    assert report.assets[0].name.startswith("ppt/media/")
    assert find(report, "Revenue by quarter").page_number == 3
    chart = [e for e in report.elements if e.type == "table"][1]
    assert (chart.page_number, chart.section_path) == (3, ("Trend",))
    assert chart.text.split("\n")[2:] == [
        "| Q1 | 10 | 7 |",
        "| Q2 | 12.5 | 8 |",
    ]


def test_pptx_vertical_merge_carries_label_to_every_covered_row() -> None:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Rates"
    table = slide.shapes.add_table(5, 3, Inches(1), Inches(2), Inches(6), Inches(3)).table
    for r, row in enumerate(
        [
            ("Level", "Rate", "Note"),
            ("Department level", "480", "a"),
            ("", "350", "b"),
            ("Other", "300", ""),
            ("Both", "", ""),
        ]
    ):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    table.cell(1, 0).merge(table.cell(2, 0))
    table.cell(3, 1).merge(table.cell(4, 2))  # two rows by two columns
    table.cell(3, 1).text = "shared 300"
    buf = io.BytesIO()
    deck.save(buf)
    (element,) = [
        e for e in parse_named(buf.getvalue(), "rates.pptx").elements if e.type == "table"
    ]
    assert element.text.split("\n")[2:] == [
        "| Department level | 480 | a |",
        "| Department level | 350 | b |",
        "| Other | shared 300 |  |",
        "| Both | shared 300 |  |",
    ]
    assert element.metadata["rows"][3] == ["Both", "shared 300", ""]


# -- XLSX ---------------------------------------------------------------------------------------


def test_xlsx_sample_both_sheets() -> None:
    report = parse_sample("stanley-cups.xlsx")
    tables = [e for e in report.elements if e.type == "table"]
    assert [t.section_path for t in tables] == [("Stanley Cups",), ("Stanley Cups Since 67",)]
    assert tables[0].metadata["header"] == ["Team", "Location", "Stanley Cups"]
    assert "| Maple Leafs | TOR | 13 |" in tables[0].text
    assert "| Maple Leafs | TOR | 0 |" in tables[1].text
    assert "| Flyers | PHI | 2 |" in tables[1].text
    headings = [e.text for e in report.elements if e.type == "heading"]
    assert headings == ["Stanley Cups", "Stanley Cups Since 67"]
    text = all_text(report)
    for noise in ("None", "nan", "Unnamed", "13.0"):
        assert noise not in text
    assert report.parser == "openpyxl"


def test_bc07_merged_label_carried_to_every_row() -> None:
    import datetime as dt

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Rates"
    ws.append(["Level", "Rate"])
    ws.append(["Department level", 480])
    ws.append([None, 350])
    ws.append(["Other", 300])
    ws.merge_cells("A2:A3")
    other = wb.create_sheet("Dates")
    other.append(["Event", None, "Day", "Total"])  # column B stays empty: trimmed
    other.append([None, None, None, None])  # empty row: trimmed
    other.append(["Launch", None, dt.datetime(2026, 3, 1), "=1+1"])
    other.append(["Review", None, dt.datetime(2026, 3, 2, 14, 30), 2.5])
    buf = io.BytesIO()
    wb.save(buf)
    report = parse_named(buf.getvalue(), "rates.xlsx")
    rates = next(e for e in report.elements if e.type == "table")
    assert rates.section_path == ("Rates",)
    assert rates.metadata["header"] == ["Level", "Rate"]
    assert rates.metadata["rows"] == [
        ["Department level", "480"],
        ["Department level", "350"],
        ["Other", "300"],
    ]
    lines = rates.text.split("\n")
    assert lines[2:] == [
        "| Department level | 480 |",
        "| Department level | 350 |",
        "| Other | 300 |",
    ]
    assert not any("Other" in line and "350" in line for line in lines)
    dates = [e for e in report.elements if e.type == "table"][1]
    assert dates.metadata["header"] == ["Event", "Day", "Total"]
    assert dates.text.split("\n")[2:] == [
        "| Launch | 2026-03-01 | =1+1 (not calculated) |",  # no cached value
        "| Review | 2026-03-02 14:30:00 | 2.5 |",
    ]
    text = all_text(report)
    for noise in ("None", "nan", "Unnamed: 0"):
        assert noise not in text


def test_xlsx_sparse_far_cells_and_whole_column_merges_stay_small() -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["Item", "Qty"])
    ws.append(["Batch A", 4])
    ws.append([None, 6])
    ws["Z60000"] = "far note"
    buf = io.BytesIO()
    wb.save(buf)
    # A label merged down the whole sheet and a dimension claiming every cell, written into the
    # XML directly (openpyxl itself would create a million objects to save that merge).
    with zipfile.ZipFile(buf) as source:
        entries = {name: source.read(name) for name in source.namelist()}
    sheet = entries["xl/worksheets/sheet1.xml"].decode()
    sheet = sheet.replace(
        "</sheetData>",
        '</sheetData><mergeCells count="1"><mergeCell ref="A2:A1048576"/></mergeCells>',
    )
    sheet = sheet.replace('<dimension ref="A1:Z60000"/>', '<dimension ref="A1:XFD1048576"/>')
    assert "XFD1048576" in sheet and "A2:A1048576" in sheet
    entries["xl/worksheets/sheet1.xml"] = sheet.encode()
    started = time.monotonic()
    report = parse_named(zip_bytes(entries), "sparse.xlsx")
    assert time.monotonic() - started < 10
    table = next(e for e in report.elements if e.type == "table")
    assert table.metadata["header"] == ["Item", "Qty", ""]
    assert table.metadata["rows"] == [
        ["Batch A", "4", ""],
        ["Batch A", "6", ""],
        ["Batch A", "", "far note"],  # row 60000 is inside the merged range too
    ]
    assert table.text.split("\n")[-1] == "| Batch A |  | far note |"


# -- CSV and TXT --------------------------------------------------------------------------------


def test_csv_sample() -> None:
    report = parse_sample("stanley-cups.csv")
    assert report.elements[0].text == "Stanley Cups"
    table = report.elements[1]
    assert table.metadata["header"] == ["Team", "Location", "Stanley Cups"]
    assert table.text.split("\n")[2] == "| Blues | STL | 1 |"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("bom-semicolon.csv", "\ufeffname;region;units\nwidget;EU;12\ngadget;US;7\n".encode()),
        ("tabs.csv", b"name\tregion\tunits\nwidget\tEU\t12\ngadget\tUS\t7\n"),
        ("pipes.csv", b"name|region|units\r\nwidget|EU|12\r\ngadget|US|7\r\n"),
        ("commas.csv", b'name,region,units\nwidget,EU,12\ngadget,"US",7\n'),
    ],
)
def test_bc05_delimiter_and_bom_detected(name: str, data: bytes) -> None:
    report = parse_named(data, name)
    assert report.parser == "native-csv"
    (table,) = report.elements
    assert table.metadata["header"] == ["name", "region", "units"]
    assert "\ufeff" not in table.metadata["header"][0]
    assert all(len(row) == 3 for row in table.metadata["rows"])
    assert table.text.split("\n")[2:] == ["| widget | EU | 12 |", "| gadget | US | 7 |"]


def test_bc05_quoted_newlines_and_latin1() -> None:
    data = 'name;note\n"Müller";"line one\nline two"\n'.encode("cp1252")
    (table,) = parse_named(data, "notes.csv").elements
    assert table.text.split("\n")[2:] == ["| Müller | line one", "line two |"]  # BC-06: kept


BILINGUAL = "Knowledge bases answer questions. 知识库可以回答问题。\nSecond line 第二行"


def test_bc09_four_encodings_identical_and_random_bytes_refused() -> None:
    files = {
        "utf8.txt": BILINGUAL.encode("utf-8"),
        "utf8-bom.txt": BILINGUAL.encode("utf-8-sig"),
        "utf16-bom.txt": BILINGUAL.encode("utf-16"),  # BOM + native (little-endian) order
        "gbk.txt": BILINGUAL.encode("gbk"),
    }
    assert files["utf16-bom.txt"][:2] == b"\xff\xfe"
    texts = {name: all_text(parse_named(data, name)) for name, data in files.items()}
    assert set(texts.values()) == {BILINGUAL}
    assert not any(t.startswith("\ufeff") for t in texts.values())
    noise = random.Random(9).randbytes(2048)
    with pytest.raises(EncodingError) as exc:
        parse_named(noise, "random.txt")
    assert exc.value.code == "undetectable_encoding"
    assert exc.value.message == "could not determine text encoding"


# -- HTML and Markdown --------------------------------------------------------------------------


def test_html_samples_keep_table_cells() -> None:
    tenk = parse_sample("example-10k-1p.html")
    symbols = find(tenk, "GLXZ")
    assert symbols.type == "table"
    assert "Common stock | GLXZ | OTCQB marketplace" in symbols.text
    assert "Item 1A. | Risk Factors | 9" in find(tenk, "Risk Factors").text
    assert "Commission file number: 000-30653" in all_text(tenk)
    fake = parse_sample("fake-html.html")
    cell = find(fake, "Row 2, Cell 2")
    assert cell.type == "table" and cell.section_path[-1] == "A Third Heading"


def test_markdown_sample() -> None:
    report = parse_sample("codeblock.md")
    assert report.parser == "native-markdown"
    html = find(report, "<h1>Hello, World!</h1>")
    assert (html.type, html.metadata, html.section_path) == (
        "code",
        {"language": "html"},
        ("HTML Example",),
    )
    notes = [e for e in report.elements if "Don't forget me this weekend!" in e.text]
    assert [(e.type, e.section_path) for e in notes] == [("code", ("XML Example",))] * 2


# -- E-mail -------------------------------------------------------------------------------------


def test_eml_sample_headers_and_plain_body() -> None:
    report = parse_sample("fake-email.eml")
    headers = report.elements[0]
    assert headers.metadata == {"part": "headers"}
    assert headers.text.split("\n") == [
        "From: Matthew Robinson <mrobinson@unstructured.io>",
        "To: NotMatthew <NotMatthew@notunstructured.com>",
        "Date: Fri, 16 Dec 2022 17:04:16 -0500",
        "Subject: Test Email",
    ]
    assert report.elements[1].text == "This is a test email to use for unit tests."
    assert "- Roses are red" in all_text(report) and "Violets are blue" in all_text(report)
    assert "<div" not in all_text(report)  # the text/plain alternative was chosen


def test_eml_sample_with_image_attachment() -> None:
    report = parse_sample("email-with-image.eml")
    assert "Subject: email-with-image" in report.elements[0].text
    assert "The unstructured logo is attached to this email." in all_text(report)
    listing = find(report, "Attachment: unstructured_logo.png")
    assert listing.text == "Attachment: unstructured_logo.png (image/png, 215,758 bytes)"
    assert listing.metadata == {
        "part": "attachment",
        "name": "unstructured_logo.png",
        "mime_type": "image/png",
        "size": 215758,
    }
    (asset,) = report.assets
    assert (asset.kind, asset.mime_type, asset.name) == (
        "image",
        "image/png",
        "unstructured_logo.png",
    )
    assert asset.data.startswith(PNG_MAGIC) and len(asset.data) == 215758


def test_msg_sample() -> None:
    report = parse_sample("fake-email.msg")
    assert report.parser == "olefile-msg"
    headers = report.elements[0].text.split("\n")
    assert headers[0] == "From: Matthew Robinson <mrobinson@unstructured.io>"
    assert "Subject: Test Email" in headers
    assert "Date: Fri, 16 Dec 2022 17:04:16 -0500" in headers
    assert report.elements[1].text == "This is a test email to use for unit tests."
    assert "Roses are red" in all_text(report)


def test_eml_rfc2047_declared_charsets_html_body_and_text_attachment() -> None:
    message = EmailMessage()
    message["From"] = "Jürgen Groß <jg@example.com>"
    message["To"] = "王伟 <wang@example.cn>"
    message["Subject"] = "Prüfbericht für Q3 — 季度报告"
    message["Date"] = "Tue, 03 Mar 2026 10:00:00 +0100"
    message.set_content(
        "<html><body><h1>Übersicht</h1><p>Umsatz gestiegen, café ouvert.</p></body></html>",
        subtype="html",
        charset="iso-8859-1",
    )
    message.add_attachment(
        b"name,units\nwidget,12\n", maintype="text", subtype="csv", filename="units.csv"
    )
    message.add_attachment(png_bytes(), maintype="image", subtype="png", filename="chart.png")
    raw = message.as_bytes()
    assert b"=?utf-8?" in raw and b"iso-8859-1" in raw  # really encoded words and a charset
    report = parse_named(raw, "mail.eml")
    headers = report.elements[0].text
    assert "Subject: Prüfbericht für Q3 — 季度报告" in headers
    assert "From: Jürgen Groß <jg@example.com>" in headers
    heading = find(report, "Übersicht")
    assert heading.type == "heading"
    assert find(report, "café ouvert").section_path == ("Übersicht",)
    csv_rows = find(report, "| widget | 12 |")
    assert csv_rows.section_path == ("units.csv",)
    names = [e.metadata["name"] for e in report.elements if e.metadata.get("part") == "attachment"]
    assert names == ["units.csv", "chart.png"]
    assert [a.name for a in report.assets] == ["chart.png"]


def test_eml_forwarded_message_attachment_is_parsed_under_its_subject() -> None:
    inner = EmailMessage()
    inner["From"] = "vendor@example.com"
    inner["To"] = "buyer@example.com"
    inner["Subject"] = "Quote 2291"
    inner.set_content("Price per unit: FORWARD-77 euros.")
    outer = EmailMessage()
    outer["From"] = "buyer@example.com"
    outer["To"] = "boss@example.com"
    outer["Subject"] = "Fwd: Quote 2291"
    outer.set_content("See the quote below.")
    outer.add_attachment(inner)
    report = parse_named(outer.as_bytes(), "fwd.eml")
    listing = find(report, "Attachment: Quote 2291.eml")
    assert listing.metadata["mime_type"] == "message/rfc822"
    price = find(report, "FORWARD-77")
    assert price.section_path == ("Quote 2291.eml",)
    assert find(report, "Subject: Quote 2291").section_path == ("Quote 2291.eml",)
    assert [e.text for e in report.elements].count("Price per unit: FORWARD-77 euros.") == 1


def test_eml_gbk_body_and_encoded_subject() -> None:
    body = "会议纪要：预算已批准。".encode("gbk")
    raw = (
        b"From: a@example.cn\r\nTo: b@example.cn\r\n"
        b"Subject: =?gbk?B?" + __import__("base64").b64encode("预算".encode("gbk")) + b"?=\r\n"
        b"Content-Type: text/plain; charset=gbk\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" + body
    )
    report = parse_named(raw, "notes.txt")  # a text name follows the content
    assert report.parser == "native-email"
    assert "Subject: 预算" in report.elements[0].text
    assert report.elements[1].text == "会议纪要：预算已批准。"


def test_eml_undeclared_or_wrong_charset_is_detected() -> None:
    undeclared = (
        b"From: a@example.com\r\nTo: b@example.com\r\nSubject: menu\r\n"
        b"Content-Type: text/plain\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        + "Crème brûlée für Jürgen, naïve café".encode()
    )
    report = parse_named(undeclared, "menu.eml")
    assert report.elements[1].text == "Crème brûlée für Jürgen, naïve café"
    wrong = undeclared.replace(b"text/plain", b"text/plain; charset=us-ascii")
    assert parse_named(wrong, "menu.eml").elements[1].text == "Crème brûlée für Jürgen, naïve café"


_SECT, _MINI, _CUTOFF = 512, 64, 4096
_FREE, _END, _FATSECT = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD


def compound_file(tree: dict) -> bytes:
    """A compound file (CFB version 3, the container of Outlook MSG) holding ``tree``: name ->
    bytes for a stream, name -> dict for a storage. Streams under 4 KiB live in the mini
    stream, as the format requires; siblings are chained through right pointers."""
    entries: list[list] = [["Root Entry", 5, [], b""]]

    def add(name: str, node) -> int:
        storage = isinstance(node, dict)
        entries.append([name, 1 if storage else 2, [], b"" if storage else node])
        index = len(entries) - 1
        if storage:
            entries[index][2] = [add(k, v) for k, v in node.items()]
        return index

    entries[0][2] = [add(k, v) for k, v in tree.items()]
    sectors: list[bytes] = []
    fat: list[int] = []

    def chain(blob: bytes) -> int:
        count = (len(blob) + _SECT - 1) // _SECT
        first = len(sectors)
        for k in range(count):
            sectors.append(blob[k * _SECT : (k + 1) * _SECT].ljust(_SECT, b"\0"))
            fat.append(first + k + 1 if k < count - 1 else _END)
        return first if count else _END

    mini = bytearray()
    minifat: list[int] = []
    starts: dict[int, int] = {}
    for index, (_name, kind, _kids, data) in enumerate(entries):
        if kind != 2 or not data:
            continue
        if len(data) < _CUTOFF:
            count = (len(data) + _MINI - 1) // _MINI
            first = len(minifat)
            minifat.extend(first + k + 1 if k < count - 1 else _END for k in range(count))
            mini += data.ljust(count * _MINI, b"\0")
            starts[index] = first
        else:
            starts[index] = chain(data)
    starts[0] = chain(bytes(mini))
    entries[0][3] = bytes(mini)
    minifat_first = chain(struct.pack(f"<{len(minifat)}I", *minifat)) if minifat else _END
    minifat_count = (len(minifat) * 4 + _SECT - 1) // _SECT
    right_of = {}
    for *_, kids, _data in entries:
        right_of.update(zip(kids, kids[1:], strict=False))

    def entry(index: int) -> bytes:
        name, kind, kids, data = entries[index]
        raw = name.encode("utf-16-le") + b"\0\0"
        start = starts.get(index, _END if kind != 1 else 0)
        fields = (kind, 1, _FREE, right_of.get(index, _FREE), kids[0] if kids else _FREE)
        return struct.pack(
            "<64sHBBIII16sIQQIQ",
            raw.ljust(64, b"\0"),
            len(raw),
            *fields,
            b"\0" * 16,
            0,
            0,
            0,
            start,
            len(data),
        )

    dir_first = chain(b"".join(entry(i) for i in range(len(entries))))
    nfat = 1
    while len(fat) + nfat > nfat * (_SECT // 4):
        nfat += 1
    fat_first = len(sectors)
    fat.extend([_FATSECT] * nfat)
    fat.extend([_FREE] * (nfat * (_SECT // 4) - len(fat)))
    blob = struct.pack(f"<{len(fat)}I", *fat)
    sectors.extend(blob[k * _SECT : (k + 1) * _SECT] for k in range(nfat))
    difat = [fat_first + k for k in range(nfat)] + [_FREE] * (109 - nfat)
    magic = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
    header = struct.pack(
        "<8s16sHHHHH6sIIIIIIIII",
        magic,
        b"\0" * 16,
        0x3E,  # minor version
        3,  # major version: 512-byte sectors
        0xFFFE,  # byte order
        9,  # sector shift
        6,  # mini sector shift
        b"\0" * 6,
        0,
        nfat,
        dir_first,
        0,
        _CUTOFF,
        minifat_first,
        minifat_count,
        _END,
        0,
    )
    return header + struct.pack("<109I", *difat) + b"".join(sectors)


def mapi_properties(header_bytes: int, props: dict[int, tuple[int, bytes]]) -> bytes:
    """A ``__properties_version1.0`` stream: ``header_bytes`` of header, then 16-byte entries
    (tag = id << 16 | type, flags, 8-byte value)."""
    out = b"\0" * header_bytes
    for pid, (ptype, value) in props.items():
        out += struct.pack("<II8s", pid << 16 | ptype, 2, value.ljust(8, b"\0"))
    return out


def make_msg() -> bytes:
    """An Outlook message with cp1251 8-bit strings, one recipient and two attachments."""

    def u(text: str) -> bytes:
        return text.encode("utf-16-le")

    # 2026-03-08 20:00:00 UTC as a FILETIME (100 ns ticks since 1601).
    submit = ((1_773_000_000 + 11_644_473_600) * 10_000_000).to_bytes(8, "little")
    return compound_file(
        {
            "__properties_version1.0": mapi_properties(
                32, {0x3FFD: (0x0003, struct.pack("<i", 1251)), 0x0039: (0x0040, submit)}
            ),
            "__substg1.0_0037001E": "Отчёт за март".encode("cp1251"),
            "__substg1.0_1000001E": "Бюджет утверждён.\r\n\r\nВторой абзац.".encode("cp1251"),
            "__substg1.0_0C1A001F": u("Анна Петрова"),
            "__substg1.0_5D01001F": u("anna@example.ru"),
            "__recip_version1.0_#00000000": {
                "__properties_version1.0": mapi_properties(8, {}),
                "__substg1.0_3001001F": u("Boris"),
                "__substg1.0_39FE001F": u("boris@example.ru"),
            },
            "__attach_version1.0_#00000000": {
                "__properties_version1.0": mapi_properties(8, {}),
                "__substg1.0_3707001F": u("minutes.txt"),
                "__substg1.0_370E001F": u("text/plain"),
                "__substg1.0_37010102": b"Action items:\n\nBook the ATTACH-5521 skis.\n",
            },
            "__attach_version1.0_#00000001": {
                "__properties_version1.0": mapi_properties(8, {}),
                "__substg1.0_3704001F": u("LOGO.PNG"),
                "__substg1.0_37010102": png_bytes(size=(80, 60)),
            },
        }
    )


def test_msg_built_code_page_recipients_and_attachments() -> None:
    data = make_msg()
    assert sniff_mime_type(data, "export.bin") == MSG
    report = parse_with_report(data, MSG)
    headers = report.elements[0].text.split("\n")
    assert headers == [
        "From: Анна Петрова <anna@example.ru>",
        "To: Boris <boris@example.ru>",
        "Date: Sun, 08 Mar 2026 20:00:00 +0000",
        "Subject: Отчёт за март",
    ]
    assert [e.text for e in report.elements[1:3]] == ["Бюджет утверждён.", "Второй абзац."]
    listings = [e.metadata for e in report.elements if e.metadata.get("part") == "attachment"]
    assert [(m["name"], m["mime_type"]) for m in listings] == [
        ("minutes.txt", "text/plain"),
        ("LOGO.PNG", "image/png"),
    ]
    skis = find(report, "ATTACH-5521")
    assert skis.section_path == ("minutes.txt",)
    (asset,) = report.assets
    assert (asset.name, asset.mime_type, asset.width, asset.height) == (
        "LOGO.PNG",
        "image/png",
        80,
        60,
    )


# -- EPUB ---------------------------------------------------------------------------------------


def test_epub_sample_spine_order_chapters_and_cover() -> None:
    report = parse_sample("winter-sports.epub")
    assert report.elements[0].type == "title"
    assert report.elements[0].text == "Winter Sports in Switzerland"
    texts = [e.text for e in report.elements]
    chapters = [t for t in texts if t.startswith("CHAPTER ")]
    assert chapters[:3] == [
        "CHAPTER I THE SUN-SEEKER",
        "CHAPTER II RINKS AND SKATERS",
        "CHAPTER III TEES AND CRAMPITS",
    ]
    bob = find(report, "Bobsleighing (or bobbing)—as quickly as possible")
    assert bob.section_path[-1] == "CHAPTER IV TOBOGGANING"
    test = next(e for e in report.elements if e.text == "THIRD-CLASS TEST")
    assert test.section_path[-2:] == ("CHAPTER II RINKS AND SKATERS", "THIRD-CLASS TEST")
    assert sum(len(t.split()) for t in texts) > 55_000
    assert [(a.name, a.mime_type) for a in report.assets] == [
        ("OEBPS/8806185773604039852_cover.jpg", "image/jpeg")
    ]


CONTAINER = (
    '<?xml version="1.0"?><container version="1.0" '
    'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
    '<rootfile full-path="book/content.opf" media-type="application/oebps-package+xml"/>'
    "</rootfiles></container>"
)
OPF = (
    '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
    'xmlns:dc="http://purl.org/dc/elements/1.1/"><metadata><dc:title>Field Guide</dc:title>'
    "</metadata><manifest>"
    '<item id="a" href="text/one.xhtml" media-type="application/xhtml+xml"/>'
    '<item id="b" href="text/two%20part.xhtml" media-type="application/xhtml+xml"/>'
    '<item id="img" href="img/fig.png" media-type="image/png"/>'
    '</manifest><spine><itemref idref="b"/><itemref idref="a"/></spine></package>'
)


def chapter(title: str, body: str) -> str:
    return (
        '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Field Guide</title></head>'
        f"<body><h1>{title}</h1><p>{body}</p></body></html>"
    )


def make_epub(extra: dict[str, str] | None = None) -> bytes:
    entries: dict[str, bytes | str] = {
        "mimetype": "application/epub+zip",
        "META-INF/container.xml": CONTAINER,
        "book/content.opf": OPF,
        "book/text/one.xhtml": chapter("Chapter Two", "Spine order puts me second."),
        "book/text/two part.xhtml": chapter("Chapter One", "Spine order puts me first."),
        "book/img/fig.png": png_bytes(),
    }
    entries.update(extra or {})
    return zip_bytes(entries, stored_first="mimetype")


def test_epub_built_follows_the_spine_not_the_manifest() -> None:
    data = make_epub()
    assert sniff_mime_type(data, "guide.bin") == EPUB
    report = parse_with_report(data, EPUB)
    assert [e.text for e in report.elements] == [
        "Field Guide",
        "Chapter One",
        "Spine order puts me first.",
        "Chapter Two",
        "Spine order puts me second.",
    ]
    assert report.elements[2].section_path == ("Chapter One",)
    assert [a.name for a in report.assets] == ["book/img/fig.png"]


DTD_CHAPTER = """<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE html [
  <!ENTITY author "Ann Ledger">
  <!ENTITY trap "text ]> that must not leak">
  <!ENTITY % pe SYSTEM "http://127.0.0.1:9/evil.dtd">
]>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Ledger</title></head>
<body><h1>Chapter Three</h1><p>Written by &author; in winter.</p></body></html>
"""


def test_epub_chapter_internal_dtd_subset_leaves_no_text_and_expands_nothing() -> None:
    data = make_epub({"book/text/one.xhtml": DTD_CHAPTER})
    texts = [e.text for e in parse_with_report(data, EPUB).elements]
    assert texts == [
        "Field Guide",
        "Chapter One",
        "Spine order puts me first.",
        "Chapter Three",
        "Written by &author; in winter.",
    ]
    assert not any("]>" in t or "ENTITY" in t or "Ann Ledger" in t for t in texts)


ENCRYPTION = (
    '<?xml version="1.0"?><encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
    'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
    '<enc:EncryptionMethod Algorithm="{algorithm}"/><enc:CipherData>'
    '<enc:CipherReference URI="{uri}"/></enc:CipherData></enc:EncryptedData></encryption>'
)


def test_epub_drm_refused_font_obfuscation_accepted() -> None:
    drm = make_epub(
        {
            "META-INF/encryption.xml": ENCRYPTION.format(
                algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc", uri="book/text/one.xhtml"
            )
        }
    )
    with pytest.raises(ProtectedDocument) as exc:
        parse_named(drm, "locked.epub")
    assert exc.value.code == "drm_protected"
    assert "DRM-protected EPUB" in exc.value.message
    fonts = make_epub(
        {
            "META-INF/encryption.xml": ENCRYPTION.format(
                algorithm="http://www.idpf.org/2008/embedding", uri="book/fonts/a.otf"
            )
        }
    )
    assert "Spine order puts me first." in all_text(parse_named(fonts, "fonts.epub"))


# -- sniffing -----------------------------------------------------------------------------------


def test_sniffing_trusts_content_over_extension() -> None:
    assert sniff_mime_type(sample("stanley-cups.xlsx"), "upload.bin") == XLSX
    assert sniff_mime_type(sample("fake-power-point.pptx"), "deck") == PPTX
    assert sniff_mime_type(sample("fake-email.msg"), "mail.dat") == MSG
    assert sniff_mime_type(sample("winter-sports.epub"), "book.zip") == EPUB
    assert sniff_mime_type(sample("fake-email.eml"), "message.txt") == EML
    assert sniff_mime_type(sample("fake.docx"), "notes.txt") == DOCX  # text names follow
    for image, mime in [
        (png_bytes(), "image/png"),
        (_encode_image("JPEG"), "image/jpeg"),
        (_encode_image("GIF"), "image/gif"),
        (_encode_image("TIFF"), "image/tiff"),
        (_encode_image("BMP"), "image/bmp"),
        (_encode_image("WEBP"), "image/webp"),
    ]:
        assert sniff_mime_type(image, "scan.dat") == mime
    assert sniff_mime_type(b"From the desk of the editor: hello", "letter.txt") == "text/plain"
    assert sniff_mime_type(b"Subject: just one header line\n\nbody", "x.eml") == EML


def _encode_image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "blue").save(buf, fmt)
    return buf.getvalue()


def test_email_with_a_long_header_block_is_sniffed_as_email() -> None:
    signature = "DKIM-Signature: v=1; a=rsa-sha256; d=example.com; b=" + "\r\n\t".join(
        ["QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * 2] * 120
    )
    raw = (
        f"Received: from mx.example.com\r\n{signature}\r\nX-Empty:\r\n"
        "From: a@example.com\r\nTo: b@example.com\r\nSubject: long headers\r\n"
        "Date: Tue, 03 Mar 2026 10:00:00 +0000\r\n\r\nBody after 8 KiB of headers.\r\n"
    ).encode()
    assert len(raw) > 8192
    assert sniff_mime_type(raw, "export.txt") == EML
    assert "Body after 8 KiB of headers." in all_text(parse_with_report(raw, EML))


@pytest.mark.parametrize(
    ("data_name", "name", "message"),
    [
        ("png", "invoice.pdf", "content mismatch: named .pdf but the content is a PNG image"),
        (
            "stanley-cups.xlsx",
            "report.docx",
            "content mismatch: named .docx but the content is an Excel (XLSX) workbook",
        ),
        (
            "fake.docx",
            "deck.pptx",
            "content mismatch: named .pptx but the content is a Word (DOCX) document",
        ),
        (
            "fake-email.eml",
            "mail.msg",
            "content mismatch: named .msg but the content is an e-mail message (EML)",
        ),
        (
            "fake-email.msg",
            "book.epub",
            "content mismatch: named .epub but the content is an Outlook (MSG) message",
        ),
    ],
)
def test_content_mismatch(data_name: str, name: str, message: str) -> None:
    data = png_bytes() if data_name == "png" else sample(data_name)
    with pytest.raises(ContentMismatch) as exc:
        sniff_mime_type(data, name)
    assert exc.value.code == "content_mismatch"
    assert exc.value.message == message


def test_random_bytes_and_unknown_binaries() -> None:
    noise = random.Random(4).randbytes(4096)
    with pytest.raises(EncodingError):
        parse_named(noise, "noise.txt")
    with pytest.raises(UnsupportedType) as exc:
        sniff_mime_type(b"\x00\x01\x02\x03" + noise, "blob.bin")
    assert exc.value.code == "unsupported_media_type"
    with pytest.raises(CorruptDocument) as corrupt:  # an mbox envelope line and nothing else
        parse_named(b"From someone@example.com Mon Jan  1 00:00:00 2024\n", "all.mbox")
    assert corrupt.value.code == "corrupt_document"


# -- hostile and damaged input ------------------------------------------------------------------


def test_zip_bomb_renamed_docx_refused_quickly() -> None:
    bomb = zip_bomb()
    assert len(bomb) < 1_000_000
    started = time.monotonic()
    with pytest.raises(ArchiveRejected) as exc:
        sniff_mime_type(bomb, "contract.docx")
    assert exc.value.code == "archive_rejected"
    assert "bytes when expanded exceed the limit of 268435456 bytes" in exc.value.message
    for mime in (DOCX, XLSX, PPTX, EPUB):  # every ZIP parser admits the container first
        with pytest.raises(ArchiveRejected):
            parse_with_report(bomb, mime)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("make", "name", "message"),
    [
        (lambda: sample("stanley-cups.xlsx"), "a.xlsx", "corrupt or unreadable XLSX"),
        (lambda: sample("fake-power-point.pptx"), "a.pptx", "corrupt or unreadable PPTX"),
        (make_epub, "a.epub", "corrupt or unreadable EPUB"),
        (
            lambda: sample("fake-email.msg"),
            "a.msg",
            "corrupt or unreadable Outlook message (MSG)",
        ),
    ],
)
def test_truncated_containers_are_corrupt_with_format_message(make, name, message) -> None:
    data = make()
    truncated = data[: len(data) // 2]
    with pytest.raises(CorruptDocument) as exc:
        parse_named(truncated, name)
    assert exc.value.code == "corrupt_document"
    assert exc.value.message.startswith(message)


def test_unsupported_zip_version_is_corrupt_not_a_crash() -> None:
    data = bytearray(sample("fake.docx"))
    directory = data.index(b"PK\x01\x02")
    struct.pack_into("<H", data, directory + 6, 89)  # "version needed to extract": 8.9
    with pytest.raises(CorruptDocument) as exc:
        parse_named(bytes(data), "a.docx")
    assert exc.value.message == "corrupt or unreadable DOCX"
    with pytest.raises(UnsupportedType) as unsupported:
        sniff_mime_type(bytes(data), "a.zip")
    assert unsupported.value.mime_type == "application/zip"


def test_damaged_inputs_raise_only_parse_errors() -> None:
    """Byte flips and truncations of every new format end in elements or a ParseError."""
    rng = random.Random(11)
    originals = {
        "a.xlsx": sample("stanley-cups.xlsx"),
        "a.pptx": make_pptx(),
        "a.epub": make_epub(),
        "a.eml": sample("fake-email.eml"),
        "a.msg": sample("fake-email.msg"),
        "b.msg": make_msg(),
        "a.docx": sample("docx-tables.docx"),
    }
    for name, original in originals.items():
        for _ in range(15):
            data = bytearray(original)
            if rng.random() < 0.5:
                for _ in range(rng.randint(1, 10)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                data = data[: rng.randrange(1, len(data))]
            try:
                parse_named(bytes(data), name)
            except ParseError:
                pass


def test_every_non_pdf_sample_parses_to_clean_elements() -> None:
    folder = shared_path("data", "sample-docs")
    parsed = []
    for path in sorted(folder.iterdir()):
        if path.suffix in (".pdf", "") or path.name == "README.md":
            continue
        report = parse_named(path.read_bytes(), path.name)
        assert report.elements, path.name
        for e in report.elements:
            assert e.text and e.text == e.text.strip(), path.name
            assert (e.level is not None) == (e.type == "heading"), path.name
            assert e.page_number is None or path.suffix == ".pptx", path.name
        parsed.append(path.name)
    assert len(parsed) == 14


# -- upload admission ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_upload_refuses_zip_bomb_and_mismatch_with_nothing_stored(client, space, object_storage):
    from ingestion.models import Document

    bomb = upload(client, space, "contract.docx", zip_bomb())
    assert bomb.status_code == 400
    assert bomb.json()["code"] == "archive_rejected"
    mismatch = upload(client, space, "invoice.pdf", png_bytes())
    assert mismatch.status_code == 415
    body = mismatch.json()
    assert body["code"] == "content_mismatch"
    assert body["message"] == "content mismatch: named .pdf but the content is a PNG image"
    assert body["details"]["detected"] == "image/png"
    assert not Document.objects.exists()
    assert not [p for p in object_storage.rglob("*") if p.is_file()]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("stanley-cups.xlsx", "| Maple Leafs | TOR | 0 |"),
        ("sample-presentation.pptx", "1 | A1 | B1 | C1"),
        ("fake-email.msg", "This is a test email to use for unit tests."),
        ("email-with-image.eml", "Attachment: unstructured_logo.png"),
        ("guide.epub", "Spine order puts me first."),  # the sample book takes a minute
    ],
)
def test_new_formats_compile_to_published(client, space, name, expected):
    from ingestion.models import Document, KnowledgeNode
    from knowledgefs.testing.fixtures import compile_all

    data = make_epub() if name == "guide.epub" else sample(name)
    response = upload(client, space, name, data)
    assert response.status_code == 202, response.content
    compile_all()
    document = Document.objects.get()
    assert document.state == "published", document.state
    nodes = KnowledgeNode.objects.filter(document=document)
    assert any(expected in n.text for n in nodes)
    if name.endswith(".pptx"):
        table = next(n for n in nodes if expected in n.text)
        assert table.page_number == 4


def msg_8bit(code_page: int | None, subject: str, body: str, encoding: str) -> bytes:
    """An MSG whose subject and body are 8-bit strings in ``encoding``, declaring
    ``code_page`` as PR_MESSAGE_CODEPAGE (none when ``None``), with one recipient whose name
    is an 8-bit string too."""
    props = {} if code_page is None else {0x3FFD: (0x0003, struct.pack("<i", code_page))}
    return compound_file(
        {
            "__properties_version1.0": mapi_properties(32, props),
            "__substg1.0_0037001E": subject.encode(encoding),
            "__substg1.0_1000001E": body.encode(encoding),
            "__recip_version1.0_#00000000": {
                "__properties_version1.0": mapi_properties(8, {}),
                "__substg1.0_3001001E": subject.split()[0].encode(encoding),
            },
        }
    )


@pytest.mark.parametrize(
    ("code_page", "encoding", "subject", "body"),
    [
        (50220, "iso2022_jp", "会議の議事録", "来週の会議は火曜日です。"),
        (50221, "iso2022_jp_ext", "会議の議事録", "来週の会議は火曜日です。"),
        (51932, "euc-jp", "会議の議事録", "来週の会議は火曜日です。"),
        (20932, "euc-jp", "会議の議事録", "来週の会議は火曜日です。"),
        (20936, "gb2312", "会议纪要", "下周的会议在星期二。"),
        (54936, "gb18030", "会议纪要", "下周的会议在星期二。"),
        (51949, "euc-kr", "회의 안건", "다음 회의는 화요일입니다."),
        (50225, "iso2022_kr", "회의 안건", "다음 회의는 화요일입니다."),
        (20866, "koi8-r", "Отчёт за март", "Бюджет утверждён."),
        (21866, "koi8-u", "Звіт за березень", "Бюджет затверджено, дякуємо їм."),
        (28591, "latin-1", "Réunion à Besançon", "Le budget a été approuvé."),
        (28592, "iso8859-2", "Zażółć gęślą", "Pójdźże, kiń tę chmurność."),
        (28595, "iso8859-5", "Отчёт за март", "Бюджет утверждён."),
        (28597, "iso8859-7", "Αναφορά Μαρτίου", "Ο προϋπολογισμός εγκρίθηκε."),
        (28599, "iso8859-9", "Toplantı notları", "Bütçe onaylandı, teşekkürler."),
        (28603, "iso8859-13", "Ataskaita už kovą", "Biudžetas patvirtintas."),
        (28605, "iso8859-15", "Coût: 20 €", "Œuvre réglée."),
        (65000, "utf-7", "Réunion 会議", "Le budget a été approuvé."),
        (1201, "utf-16-be", "Réunion", "Le budget a été approuvé."),
    ],
)
def test_msg_windows_code_page_numbers_map_to_their_codecs(
    code_page: int, encoding: str, subject: str, body: str
) -> None:
    report = parse_with_report(msg_8bit(code_page, subject, body, encoding), MSG)
    headers = report.elements[0].text.split("\n")
    assert headers == [f"To: {subject.split()[0]}", f"Subject: {subject}"]
    assert report.elements[1].text == body


@pytest.mark.parametrize(
    ("encoding", "subject", "body"),
    [
        ("koi8-r", "Отчёт за март", "Бюджет утверждён. Второй абзац письма о поездке."),
        ("cp1251", "Отчёт за март", "Бюджет утверждён. Второй абзац письма о поездке."),
        ("cp1252", "Réunion à Orléans", "Le budget a été approuvé à l'unanimité, très bien."),
        ("euc-jp", "会議の議事録", "来週の会議は火曜日です。よろしくお願いします。"),
        ("shift_jis", "会議の議事録", "来週の会議は火曜日です。よろしくお願いします。"),
    ],
)
def test_msg_without_code_page_detects_8bit_strings_like_text(
    encoding: str, subject: str, body: str
) -> None:
    report = parse_with_report(msg_8bit(None, subject, body, encoding), MSG)
    assert report.elements[0].text.split("\n") == [
        f"To: {subject.split()[0]}",
        f"Subject: {subject}",
    ]
    assert report.elements[1].text == body
