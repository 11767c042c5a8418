"""PPTX decks built with python-pptx: case BC-45 (grouped shapes, tables, connectors, notes,
hidden slides)."""

from __future__ import annotations

import io
import re

import pptx
from pptx.enum.shapes import MSO_CONNECTOR
from pptx.util import Inches

from ingestion.chunking import chunk_elements
from ingestion.parsing import parse_with_report
from ingestion.tests.test_office_tables import the_table

PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


def bc45_deck() -> bytes:
    deck = pptx.Presentation()
    blank = deck.slide_layouts[6]
    first = deck.slides.add_slide(blank)
    shapes = first.shapes
    shapes.add_textbox(
        Inches(0.5), Inches(0.5), Inches(3), Inches(1)
    ).text_frame.text = "LEFT PANEL"
    shapes.add_textbox(
        Inches(3.5), Inches(0.5), Inches(3), Inches(1)
    ).text_frame.text = "RIGHT PANEL"
    table = shapes.add_table(2, 2, Inches(0.5), Inches(2), Inches(4), Inches(1)).table
    table.cell(0, 0).text = "COL ALPHA"
    table.cell(1, 1).text = "VAL BETA"
    group = shapes.add_group_shape()
    nested = group.shapes.add_group_shape()
    nested.shapes.add_textbox(
        Inches(5), Inches(3), Inches(2), Inches(1)
    ).text_frame.text = "INNER ONE"
    nested.shapes.add_textbox(
        Inches(5), Inches(4), Inches(2), Inches(1)
    ).text_frame.text = "INNER TWO"
    shapes.add_connector(MSO_CONNECTOR.STRAIGHT, Inches(1), Inches(5), Inches(6), Inches(6))
    first.notes_slide.notes_text_frame.text = "NOTE-CANARY"
    second = deck.slides.add_slide(blank)
    second.shapes.add_textbox(
        Inches(1), Inches(1), Inches(4), Inches(1)
    ).text_frame.text = "HIDDEN-SLIDE-TEXT"
    second._element.set("show", "0")
    buf = io.BytesIO()
    deck.save(buf)
    return buf.getvalue()


def test_bc45_groups_tables_connector_notes_and_hidden_slide() -> None:
    report = parse_with_report(bc45_deck(), PPTX)
    text = "\n".join(e.text for e in report.elements)
    words = set(re.findall(r"[A-Z-]+", text))
    for word in ("LEFT", "PANEL", "RIGHT", "COL", "ALPHA", "VAL", "BETA", "INNER", "ONE", "TWO"):
        assert word in words, word
    assert "PANELRIGHT" not in text and "ONEINNER" not in text and "ALPHAVAL" not in text
    by_text = {e.text: e for e in report.elements}
    assert by_text["LEFT PANEL"].page_number == 1 and by_text["RIGHT PANEL"].page_number == 1
    assert by_text["INNER ONE"].page_number == 1 and by_text["INNER TWO"].page_number == 1
    table = the_table(report)
    assert table.page_number == 1
    assert table.metadata["rows"] == [["COL ALPHA", ""], ["", "VAL BETA"]]
    # notes: indexed on their slide, tagged
    notes = by_text["NOTE-CANARY"]
    assert (notes.page_number, notes.metadata) == (1, {"part": "notes"})
    # the hidden slide: indexed on its own slide number, tagged hidden, named in the warnings
    hidden = by_text["HIDDEN-SLIDE-TEXT"]
    assert hidden.page_number == 2 and hidden.metadata.get("hidden_slide") is True
    assert not any(e.metadata.get("hidden_slide") for e in report.elements if e.page_number == 1)
    assert report.warnings == ["slide 2 is hidden; it was indexed and tagged hidden_slide"]


def test_bc45_chunks_carry_the_slide_number() -> None:
    report = parse_with_report(bc45_deck(), PPTX)
    chunks = chunk_elements(report.elements)
    pages = {c.page_number for c in chunks if "INNER TWO" in c.text or "VAL BETA" in c.text}
    assert pages == {1}
    assert {c.page_number for c in chunks if "HIDDEN-SLIDE-TEXT" in c.text} == {2}
    assert all(c.page_number in (1, 2) for c in chunks)
