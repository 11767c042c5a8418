"""Tables of office documents keep every column position (cases BC-07, BC-08).

DOCX tables are built with python-docx, and where python-docx cannot express the grid
(``w:gridBefore``/``w:gridAfter`` with ``w:vMerge``) the table XML is written by the test.
"""

from __future__ import annotations

import io

import docx
import openpyxl
from docx.oxml import parse_xml

from ingestion.parsing import ParseReport, parse_with_report

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def tc(text: str, *, span: int = 1, vmerge: str | None = None) -> str:
    props = f'<w:gridSpan w:val="{span}"/>' if span > 1 else ""
    if vmerge == "continue":
        props += "<w:vMerge/>"
    elif vmerge:
        props += f'<w:vMerge w:val="{vmerge}"/>'
    body = f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>" if text else "<w:p/>"
    return f"<w:tc><w:tcPr>{props}</w:tcPr>{body}</w:tc>"


def tr(*cells: str, before: int = 0, after: int = 0) -> str:
    props = f'<w:gridBefore w:val="{before}"/>' if before else ""
    props += f'<w:gridAfter w:val="{after}"/>' if after else ""
    return f"<w:tr><w:trPr>{props}</w:trPr>{''.join(cells)}</w:tr>"


def docx_with_table(columns: int, *rows: str) -> bytes:
    grid = '<w:gridCol w:w="1200"/>' * columns
    xml = f"<w:tbl {_W}><w:tblPr/><w:tblGrid>{grid}</w:tblGrid>{''.join(rows)}</w:tbl>"
    document = docx.Document()
    document.add_paragraph("After the table.")
    document.element.body.insert(0, parse_xml(xml))
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


def the_table(report: ParseReport):
    (table,) = [e for e in report.elements if e.type == "table"]
    return table


def test_bc08_blank_docx_cell_keeps_its_column() -> None:
    document = docx.Document()
    table = document.add_table(rows=2, cols=5)
    for c, value in enumerate(["0-1", "0-2", "0-3", "0-4", "0-5"]):
        table.cell(0, c).text = value
    for c, value in enumerate(["1-1", "", "1-2", "1-3", "1-4"]):
        table.cell(1, c).text = value
    buf = io.BytesIO()
    document.save(buf)
    element = the_table(parse_with_report(buf.getvalue(), DOCX))
    assert element.text.split("\n") == ["0-1 | 0-2 | 0-3 | 0-4 | 0-5", "1-1 |  | 1-2 | 1-3 | 1-4"]
    assert element.metadata["rows"][1] == ["1-1", "", "1-2", "1-3", "1-4"]
    assert "1-1 | 1-2" not in element.text


def test_docx_grid_offsets_and_vertical_merges_keep_every_value_in_its_column() -> None:
    data = docx_with_table(
        4,
        tr(tc("Q1"), tc("Q2"), tc("Q3"), before=1),  # the header starts one column in
        tr(tc("North", vmerge="restart"), tc("10"), tc("11"), tc("12")),
        tr(tc("", vmerge="continue"), tc("20"), tc(""), tc("22")),
        tr(tc("30"), tc("31"), before=2),  # does not reach the merged column
        tr(tc("", vmerge="continue"), tc("40"), tc("41", span=2)),
        tr(tc("South"), tc("50"), after=2),
    )
    element = the_table(parse_with_report(data, DOCX))
    assert element.metadata["rows"] == [
        ["", "Q1", "Q2", "Q3"],
        ["North", "10", "11", "12"],
        ["North", "20", "", "22"],
        ["", "", "30", "31"],
        ["North", "40", "41", ""],
        ["South", "50", "", ""],
    ]
    assert element.text.split("\n") == [
        "| Q1 | Q2 | Q3",
        "North | 10 | 11 | 12",
        "North | 20 |  | 22",
        "|  | 30 | 31",
        "North | 40 | 41",
        "South | 50",
    ]


def test_docx_merged_cell_in_an_offset_row_is_carried_like_xlsx() -> None:
    data = docx_with_table(
        4,
        tr(tc("Region"), tc("Site"), tc("Q1"), tc("Q2")),
        tr(tc("Hub", vmerge="restart"), tc("1"), tc("2"), before=1),
        tr(tc("", vmerge="continue"), tc("3"), tc("4"), before=1),
    )
    element = the_table(parse_with_report(data, DOCX))
    assert element.metadata["header"] == ["Region", "Site", "Q1", "Q2"]
    assert element.text.split("\n")[2:] == ["|  | Hub | 1 | 2 |", "|  | Hub | 3 | 4 |"]

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.append(["Region", "Site", "Q1", "Q2"])
    sheet.append([None, "Hub", 1, 2])
    sheet.append([None, None, 3, 4])
    sheet.merge_cells("B2:B3")
    buf = io.BytesIO()
    workbook.save(buf)
    sheet_table = the_table(parse_with_report(buf.getvalue(), XLSX))
    assert sheet_table.text.split("\n") == element.text.split("\n")


def test_blank_cells_keep_their_column_in_headerless_sheets_and_nested_docx_tables() -> None:
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.append([1, 2, 3, 4])
    sheet.append([5, None, 7, 8])
    buf = io.BytesIO()
    workbook.save(buf)
    assert the_table(parse_with_report(buf.getvalue(), XLSX)).text.split("\n") == [
        "1 | 2 | 3 | 4",
        "5 |  | 7 | 8",
    ]

    document = docx.Document()
    outer = document.add_table(rows=1, cols=2)
    outer.cell(0, 0).text = "Outer"
    inner = outer.cell(0, 1).add_table(rows=1, cols=3)
    inner.cell(0, 0).text = "a"
    inner.cell(0, 2).text = "c"
    buf = io.BytesIO()
    document.save(buf)
    text = the_table(parse_with_report(buf.getvalue(), DOCX)).text
    assert text == "Outer | a | | c"  # the cell's text collapses its spaces
