"""Line breaks inside table cells (CSV quoted cells, spreadsheet cells): kept in the row's
text, in its chunk and at its exact offsets (pure Python: no Django, no database)."""

from __future__ import annotations

import io

import openpyxl

from ingestion.chunking import canonical_text, chunk_elements
from ingestion.parsing import parse, sniff_mime_type

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def test_bc06_quoted_newline_in_a_csv_cell_is_kept() -> None:
    data = b'id,note,owner\n1,"line one\nline two",ann\n2,plain,bob\n'
    elements = parse(data, sniff_mime_type(data, "notes.csv"))
    (table,) = elements
    assert table.text == (
        "| id | note | owner |\n| --- | --- | --- |\n| 1 | line one\nline two | ann |\n"
        "| 2 | plain | bob |"
    )
    assert table.metadata["rows"][0] == ["1", "line one\nline two", "ann"]
    canonical, _ = canonical_text(elements)
    (chunk,) = chunk_elements(elements)
    assert "line one\nline two" in chunk.text
    assert canonical[chunk.start_offset : chunk.end_offset] == chunk.text


def test_bc06_crlf_and_blank_lines_inside_a_cell() -> None:
    data = b'a;b\r\nx;"first  line\r\n\r\n  second\tline "\r\n'
    (table,) = parse(data, "text/csv")
    assert table.text == "| a | b |\n| --- | --- |\n| x | first line\nsecond line |"


def test_bc06_a_split_table_never_cuts_a_multi_line_row() -> None:
    rows = "".join(
        f'{i},"row {i} starts here\nand row {i} ends here",{"x" * 40}\n' for i in range(60)
    )
    elements = parse(("n,text,pad\n" + rows).encode(), "text/csv")
    canonical, _ = canonical_text(elements)
    chunks = chunk_elements(elements, target_chars=200, overlap_chars=0)
    assert len(chunks) > 3
    for chunk in chunks:
        assert canonical[chunk.start_offset : chunk.end_offset] == chunk.text
        for line in chunk.text.split("\n"):
            if line.startswith("| "):
                continue
            assert line.startswith("and row "), chunk.text  # a continuation with its row
        starts = [ln for ln in chunk.text.split("\n") if ln.startswith("| ") and "row" in ln]
        ends = [ln for ln in chunk.text.split("\n") if ln.startswith("and row ")]
        assert len(starts) == len(ends)


def test_a_spreadsheet_cell_with_line_breaks_keeps_them() -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["item", "address"])
    sheet.append(["depot", "1 Quay Street\nHarbour Town"])
    buffer = io.BytesIO()
    book.save(buffer)
    elements = parse(buffer.getvalue(), XLSX)
    table = next(e for e in elements if e.type == "table")
    assert (
        table.text == "| item | address |\n| --- | --- |\n| depot | 1 Quay Street\nHarbour Town |"
    )
