"""Spreadsheet formulas without a cached value and hidden sheets (XLSX, built by the tests).

openpyxl writes formulas without computed values (as every script does); Excel's own files
carry them. Where openpyxl cannot express a form (a cached value, a shared formula) the sheet
XML is rewritten with ``zipfile``.
"""

from __future__ import annotations

import io
import zipfile

import openpyxl

from ingestion.parsing import parse_with_report

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def workbook_bytes(workbook: openpyxl.Workbook) -> bytes:
    buf = io.BytesIO()
    workbook.save(buf)
    return buf.getvalue()


def rewrite(data: bytes, part: str, edit) -> bytes:
    """A copy of the container with ``part`` replaced by ``edit(old_text)``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            blob = source.read(info.filename)
            if info.filename == part:
                blob = edit(blob.decode()).encode()
            target.writestr(info, blob, compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def budget() -> openpyxl.Workbook:
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Budget"
    sheet.append(["Item", "Amount", "Double"])
    sheet.append(["Rent", 100, "=B2*2"])
    sheet.append(["Food", 50, "=B3*2"])
    sheet.append(["Total", "=SUM(B2:B3)", None])
    return workbook


def test_formula_without_a_cached_value_is_indexed_as_its_formula_marked_not_calculated() -> None:
    report = parse_with_report(workbook_bytes(budget()), XLSX)
    (table,) = [e for e in report.elements if e.type == "table"]
    assert table.text.split("\n") == [
        "| Item | Amount | Double |",
        "| --- | --- | --- |",
        "| Rent | 100 | =B2*2 (not calculated) |",
        "| Food | 50 | =B3*2 (not calculated) |",
        "| Total | =SUM(B2:B3) (not calculated) |  |",
    ]
    assert table.metadata["rows"][2] == ["Total", "=SUM(B2:B3) (not calculated)", ""]
    assert report.warnings == [
        "sheet 'Budget': 3 formula cells have no calculated value in the file; their formulas"
        " are indexed marked (not calculated)"
    ]


def test_cached_values_win_and_shared_formulas_are_translated() -> None:
    data = workbook_bytes(budget())

    def excel_like(xml: str) -> str:
        # B4 as Excel saves it (formula and cached value); C2:C3 one shared formula, uncached.
        xml = xml.replace("<f>SUM(B2:B3)</f><v></v>", "<f>SUM(B2:B3)</f><v>150</v>")
        xml = xml.replace("<f>B2*2</f><v></v>", '<f t="shared" ref="C2:C3" si="0">B2*2</f>')
        return xml.replace("<f>B3*2</f><v></v>", '<f t="shared" si="0"/>')

    report = parse_with_report(rewrite(data, "xl/worksheets/sheet1.xml", excel_like), XLSX)
    (table,) = [e for e in report.elements if e.type == "table"]
    assert table.text.split("\n") == [
        "| Item | Amount | Double |",
        "| --- | --- | --- |",
        "| Rent | 100 | =B2*2 (not calculated) |",
        "| Food | 50 | =B3*2 (not calculated) |",
        "| Total | 150 |  |",
    ]
    assert "2 formula cells have no calculated value" in report.warnings[0]


def test_a_computed_empty_string_is_not_marked() -> None:
    data = workbook_bytes(budget())

    def empty_string(xml: str) -> str:
        xml = xml.replace('<c r="C2"><f>B2*2</f><v></v>', '<c r="C2" t="str"><f>""</f><v></v>')
        return xml.replace("<f>B3*2</f><v></v>", "<f>B3*2</f><v>100</v>")

    data = rewrite(data, "xl/worksheets/sheet1.xml", empty_string)
    (table,) = [e for e in parse_with_report(data, XLSX).elements if e.type == "table"]
    assert table.metadata["rows"][0] == ["Rent", "100", ""]
    assert table.metadata["rows"][1] == ["Food", "50", "100"]


def test_hidden_sheets_indexed_and_tagged_very_hidden_skipped_both_in_warnings() -> None:
    workbook = budget()
    lookup = workbook.create_sheet("Lookup")
    lookup.append(["Code", "Label"])
    lookup.append(["HID-1", "hidden but indexed"])
    lookup.sheet_state = "hidden"
    config = workbook.create_sheet("Config")
    config.append(["Key", "Value"])
    config.append(["VERYHIDDEN-7", "macro data"])
    config.sheet_state = "veryHidden"
    report = parse_with_report(workbook_bytes(workbook), XLSX)
    text = "\n".join(e.text for e in report.elements)
    assert "HID-1" in text and "VERYHIDDEN-7" not in text and "Config" not in text
    hidden = [e for e in report.elements if e.section_path == ("Lookup",)]
    assert [e.type for e in hidden] == ["heading", "table"]
    assert all(e.metadata.get("sheet_state") == "hidden" for e in hidden)
    visible = [e for e in report.elements if e.section_path == ("Budget",)]
    assert all("sheet_state" not in e.metadata for e in visible)
    assert report.warnings[1:] == [
        "sheet 'Lookup' is hidden; it was indexed and tagged hidden",
        "sheet 'Config' is very hidden and was not indexed",
    ]
