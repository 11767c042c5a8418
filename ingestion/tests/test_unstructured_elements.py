"""Mapping the parser's JSON elements to ours (ingestion/unstructured/elements.py)."""

from __future__ import annotations

import time

import pytest

from ingestion.unstructured.elements import to_report
from ingestion.unstructured.errors import ParserEmptyOutput, ParserInvalidResponse

PDF = "application/pdf"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


def el(type_: str, text: str, **metadata) -> dict:
    return {"type": type_, "element_id": "x", "text": text, "metadata": metadata}


def test_titles_open_sections_by_depth_and_lists_headers_and_breaks_map():
    report = to_report(
        [
            el("Title", "Annual report", category_depth=0, page_number=1),
            el("NarrativeText", "Revenue grew.", page_number=1),
            el("Title", "Risks", category_depth=1, page_number=2),
            el("ListItem", "Currency exposure", page_number=2),
            el("PageBreak", ""),
            el("Header", "ACME Corp - confidential", page_number=3),
            el("PageNumber", "3", page_number=3),
            el("Title", "Outlook", category_depth=0, page_number=4),
            el("CodeSnippet", "print('hi')", page_number=4),
        ],
        mime_type=PDF,
        filename="annual.pdf",
    )
    got = [(e.type, e.text, e.level, e.section_path, e.page_number) for e in report.elements]
    assert got == [
        ("heading", "Annual report", 1, ("Annual report",), 1),
        ("paragraph", "Revenue grew.", None, ("Annual report",), 1),
        ("heading", "Risks", 2, ("Annual report", "Risks"), 2),
        ("list", "Currency exposure", None, ("Annual report", "Risks"), 2),
        ("paragraph", "ACME Corp - confidential", None, ("Annual report", "Risks"), 3),
        ("heading", "Outlook", 1, ("Outlook",), 4),
        ("code", "print('hi')", None, ("Outlook",), 4),
    ]
    assert report.elements[4].metadata == {"part": "header"}
    assert report.page_count == 4 and report.pages_without_text == []
    assert report.parser == "unstructured"


def test_pdf_pages_without_elements_are_reported():
    report = to_report(
        [el("Text", "first", page_number=1), el("Text", "third", page_number=3)],
        mime_type=PDF,
        filename="a.pdf",
    )
    assert report.page_count == 3 and report.pages_without_text == [2]


def test_slides_and_sheets_keep_their_number_in_metadata_not_as_pdf_pages():
    report = to_report(
        [el("Title", "Q3", page_number=2, page_name="Sales", category_depth=0)],
        mime_type=PPTX,
        filename="deck.pptx",
    )
    [heading] = report.elements
    assert heading.page_number is None
    assert heading.metadata == {"page": 2, "sheet": "Sales"}
    assert report.page_count is None


def test_tables_keep_their_header_and_carry_merged_cells():
    html = (
        "<table><thead><tr><th>Region</th><th>Q1</th><th>Q2</th></tr></thead><tbody>"
        '<tr><td rowspan="2">North</td><td>10</td><td>12</td></tr>'
        '<tr><td colspan="2">n/a</td></tr></tbody></table>'
    )
    [table] = to_report(
        [el("Table", "Region Q1 Q2 North 10 12 n/a", text_as_html=html)],
        mime_type=PDF,
        filename="t.pdf",
    ).elements
    assert table.metadata == {
        "header": ["Region", "Q1", "Q2"],
        "rows": [["North", "10", "12"], ["North", "n/a", "n/a"]],
    }
    assert table.text == (
        "| Region | Q1 | Q2 |\n| --- | --- | --- |\n| North | 10 | 12 |\n| North | n/a | n/a |"
    )


def test_a_first_row_that_looks_like_a_header_becomes_one_and_numbers_do_not():
    plain = "<table><tr><td>Team</td><td>Cups</td></tr><tr><td>Blues</td><td>1</td></tr></table>"
    numeric = "<table><tr><td>1</td><td>2</td></tr><tr><td>3</td><td>4</td></tr></table>"
    first, second = to_report(
        [el("Table", "Team Cups Blues 1", text_as_html=plain), el("Table", "1 2 3 4",
         text_as_html=numeric)],
        mime_type=PDF,
        filename="t.pdf",
    ).elements  # fmt: skip
    assert first.text == "| Team | Cups |\n| --- | --- |\n| Blues | 1 |"
    assert second.metadata == {"header": None, "rows": [["1", "2"], ["3", "4"]]}
    assert second.text == "1 | 2\n3 | 4"


def test_a_table_without_html_keeps_its_text():
    [table] = to_report([el("Table", "a  b\nc")], mime_type=PDF, filename="t.pdf").elements
    assert table.text == "a b c" and table.metadata == {"header": None, "rows": [["a b c"]]}


def test_attachments_are_named_and_unknown_types_are_paragraphs():
    report = to_report(
        [
            el("NarrativeText", "Body text.", filename="mail.eml"),
            el("FancyNewType", "From the attachment.", filename="invoice.pdf"),
        ],
        mime_type="message/rfc822",
        filename="mail.eml",
    )
    body, attached = report.elements
    assert body.metadata == {}
    assert (attached.type, attached.metadata) == ("paragraph", {"attachment": "invoice.pdf"})


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"elements": []}, "not a list"),
        (["text"], "element 0 of the parser's answer is not an object"),
        ([{"type": 3, "text": "x"}], "no string 'type' and 'text'"),
        ([{"type": "Text", "text": "x", "metadata": []}], "bad metadata"),
    ],
)
def test_malformed_answers_are_refused(answer, message):
    with pytest.raises(ParserInvalidResponse) as caught:
        to_report(answer, mime_type=PDF, filename="a.pdf")
    assert caught.value.code == "parser_invalid_response"
    assert message in caught.value.message


def test_no_text_is_never_a_success():
    with pytest.raises(ParserEmptyOutput) as caught:
        to_report([el("Image", ""), el("PageBreak", "")], mime_type=PDF, filename="scan.pdf")
    assert "no text for 'scan.pdf' (2 elements, none with text)" in caught.value.message


@pytest.mark.parametrize("page", [20_000_000, 10**12, 0, -3, 2.0, "7", True])
def test_a_page_number_outside_1_to_100000_is_an_invalid_answer_not_an_allocation(page):
    with pytest.raises(ParserInvalidResponse) as caught:
        to_report([el("NarrativeText", "x", page_number=page)], mime_type=PDF, filename="a.pdf")
    assert caught.value.code == "parser_invalid_response"
    assert f"element 0 of the parser's answer has page_number {page!r}" in caught.value.message
    assert "must be an integer from 1 to 100000" in caught.value.message


def test_pages_without_text_are_capped_at_the_lowest_thousand():
    report = to_report(
        [el("NarrativeText", "x", page_number=100_000), el("Text", "y", page_number=2)],
        mime_type=PDF,
        filename="a.pdf",
    )
    assert report.page_count == 100_000
    assert len(report.pages_without_text) == 1000
    assert report.pages_without_text[:3] == [1, 3, 4]
    assert report.pages_without_text[-1] == 1001


def _spans(cells: int, empty_rows: int = 0, value: str = "x") -> dict:
    html = (
        "<table><tr>"
        + f"<td colspan=100 rowspan=100>{value}</td>" * cells
        + "</tr>"
        + "<tr></tr>" * empty_rows
        + "</table>"
    )
    return el("Table", value, text_as_html=html)


def test_a_hostile_rowspan_colspan_table_is_refused_before_it_is_built():
    """1,000 cells of colspan=rowspan=100 over 100 rows would be 10 million cells (GiBs before
    the bound): refused at 2,000,000, fast."""
    started = time.monotonic()
    with pytest.raises(ParserInvalidResponse) as caught:
        to_report([_spans(1000, empty_rows=99)], mime_type=PDF, filename="t.pdf")
    assert time.monotonic() - started < 10
    assert caught.value.code == "parser_invalid_response"
    assert caught.value.message == (
        "the tables of the parser's answer cover more than 2000000 cells once their "
        "rowspan/colspan are expanded (at element 0); refused"
    )


def test_spans_repeating_a_long_cell_or_header_are_refused_by_characters():
    with pytest.raises(ParserInvalidResponse) as caught:
        to_report([_spans(1, empty_rows=99, value="y" * 100_000)], mime_type=PDF, filename="t.pdf")
    assert "hold more than 67108864 characters" in caught.value.message
    header = "<table><tr><th>" + "h" * 1_000_000 + "</th></tr>" + "<tr><td>v</td></tr>" * 100
    with pytest.raises(ParserInvalidResponse) as caught:
        to_report([el("Table", "t", text_as_html=header + "</table>")], mime_type=PDF, filename="t")
    assert "hold more than 67108864 characters" in caught.value.message


def test_one_row_of_wide_spans_within_the_bounds_keeps_its_cells():
    """The tester's shape (one row of 400 x colspan=rowspan=100): 40,000 cells, the carried
    rows never come, nothing is kept for them."""
    [table] = to_report([_spans(400)], mime_type=PDF, filename="t.pdf").elements
    assert table.metadata["rows"] == [["x"] * 40_000]


def test_a_span_ends_where_a_shorter_row_leaves_it():
    html = (
        "<table><tr><td rowspan=3>a</td><td>b</td></tr><tr></tr>"
        "<tr><td>c</td></tr><tr><td>d</td><td>e</td></tr></table>"
    )
    [table] = to_report([el("Table", "t", text_as_html=html)], mime_type=PDF, filename="t").elements
    assert table.metadata["rows"] == [["a", "b"], ["a"], ["a", "c"], ["d", "e"]]
