"""Blocks and sentences of evidence text (``retrieval/sentences.py``)."""

from __future__ import annotations

from retrieval.sentences import blocks, split_sentences


def test_a_table_row_whose_cell_holds_a_line_break_stays_one_block():
    text = (
        "| Site | Address | Phone |\n| --- | --- | --- |\n"
        "| depot | 12 Elm Street\nSpringfield | 555-0100 |\n"
        "| office | 3 Oak Road | 555-0199 |"
    )
    rows = [b.text for b in blocks(text)]
    assert "| depot | 12 Elm Street Springfield | 555-0100 |" in rows
    assert "| office | 3 Oak Road | 555-0199 |" in rows
    assert not any(row.startswith("Springfield") for row in rows)
    assert any("12 Elm Street Springfield" in s for s in split_sentences(text))


def test_an_escaped_pipe_does_not_close_a_row_and_headings_still_split():
    text = "# Sites\n| a | b \\|\nc |\nNext paragraph."
    assert [b.text for b in blocks(text)] == ["# Sites", "| a | b \\| c |", "Next paragraph."]
