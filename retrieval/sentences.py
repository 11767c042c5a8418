"""Sentences of evidence text: paragraphs rejoined across wrapped lines, headings told apart.

A chunk's text is its elements' texts joined by ``"\\n"``, and a paragraph element keeps the
line breaks of its source (Markdown wrapped at 100 columns, a PDF's lines). Splitting each line
on its own cut sentences in half ("… refused with 413" / "`file_too_large`, the message …"), so
:func:`blocks` first rejoins a line with the next when the next one continues it, and
:func:`split_sentences` then splits each block with ``sentencex`` (MIT; its rules end sentences
at ``. ! ?`` and at the CJK ``。！？``, and know abbreviations such as "Dr.").

A line **continues** the one before it when that one does not end a sentence or a lead-in
(``. ! ? : 。 ！ ？``), neither is a heading, and the line does not start a block of its own
(a list item ``-``/``*``/``+``/``1.``, a table row ``|``, a quote ``>``) and starts in lower case,
with a digit, or with ``` ` ( " “ ‘ '``. A Markdown table row (``| a | b |``) whose cell holds a
line break goes on, whatever its next lines look like, until the line that ends with ``|``. A
**heading** is a line that is one of the chunk's section path entries (the chunker keeps the
heading's text as the chunk's first lines) or a Markdown ``#`` line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sentencex import segment

_ENDS_SENTENCE = re.compile(r"[.!?:。！？][\"')\]’”»]*$")
_STARTS_BLOCK = re.compile(r"^(?:[-*+•]\s|\d{1,3}[.)]\s|\||>|#)")
_CONTINUES = re.compile(r"^[a-z\u00df-\u00ff0-9`(\"“‘']")


@dataclass(frozen=True)
class Block:
    """A paragraph (lines rejoined) or a heading line of a chunk's text."""

    text: str
    heading: bool


def _is_heading(line: str, headings: set[str]) -> bool:
    return line in headings or line.startswith("#")


def _open_row(lines: list[str]) -> bool:
    """Whether ``lines`` are a Markdown table row not closed yet (it began with ``|`` and its
    last line does not end with an unescaped ``|``)."""
    last = lines[-1]
    return lines[0].startswith("|") and not (last.endswith("|") and not last.endswith("\\|"))


def blocks(text: str, headings: Iterable[str] = ()) -> list[Block]:
    """The blocks of ``text``: headings (``headings``: the chunk's section path, and Markdown
    ``#`` lines) on their own, other lines rejoined while they continue each other (module
    docstring); blank lines end a block. Whitespace is collapsed to one space."""
    names = {" ".join(h.split()) for h in headings if h and h.strip()}
    out: list[Block] = []
    current: list[str] = []

    def close() -> None:
        if current:
            out.append(Block(" ".join(current), False))
            current.clear()

    for raw in text.splitlines():
        line = " ".join(raw.split())
        if not line:
            close()
            continue
        if current and _open_row(current):
            # A table row whose cell holds a line break ("| depot | 12 Elm Street" then
            # "Springfield |") goes on until the line that closes it.
            current.append(line)
            continue
        if _is_heading(line, names):
            close()
            out.append(Block(line, True))
            continue
        if (
            current
            and not _ENDS_SENTENCE.search(current[-1])
            and not _STARTS_BLOCK.match(line)
            and _CONTINUES.match(line)
        ):
            current.append(line)
            continue
        close()
        current.append(line)
    close()
    return out


def split_sentences(text: str, headings: Iterable[str] = ()) -> list[str]:
    """Sentences of ``text``: each block of :func:`blocks` (headings included, as one sentence
    each) split by ``sentencex``; whitespace inside a sentence collapsed to one space."""
    return [s for _, s in sentences_with_kind(text, headings)]


def sentences_with_kind(text: str, headings: Iterable[str] = ()) -> list[tuple[bool, str]]:
    """``(is_heading, sentence)`` for every sentence of :func:`split_sentences`."""
    found: list[tuple[bool, str]] = []
    for block in blocks(text, headings):
        if block.heading:
            found.append((True, block.text.lstrip("#").strip() or block.text))
            continue
        for sentence in segment("en", block.text):
            cleaned = " ".join(sentence.split())
            if cleaned:
                found.append((False, cleaned))
    return found


def table_row_sentences(text: str, headings: Iterable[str] = ()) -> set[str]:
    """The sentences of :func:`split_sentences` that come from a Markdown table row (a block
    starting with ``|``): cells of a catalogue or a grid, not prose."""
    found: set[str] = set()
    for block in blocks(text, headings):
        if block.heading or not block.text.startswith("|"):
            continue
        found.update(c for c in (" ".join(s.split()) for s in segment("en", block.text)) if c)
    return found
