"""KnowledgeFS's token approximation, for sizing chunks where the model's tokenizer is unknown.

The one rule for chunk sizing and the answer window (``retrieval/evidence.py`` imports it;
inventory §5.7):
whitespace is free; a run of Latin letters and digits of at most 8 characters is 1 token, a
longer run ``ceil(n / 4)``; every other grapheme (CJK, kana, Hangul, other scripts,
punctuation, symbols) is 1. A grapheme is approximated as a code point with the combining
marks, variation selectors and zero-width-joined code points that follow it.

The count of a prefix never exceeds the count of the whole text, so a splitter may search for
the longest prefix within a budget. Pure Python, no Django.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable

_LATIN_RUN = re.compile(r"[0-9A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]+")
_JOINERS = {"\u200d"}


def approx_tokens(text: str) -> int:
    """Approximate token count of ``text`` (rules in the module docstring); ``0`` for ``""``."""
    total = 0
    position = 0
    length = len(text)
    joined = False
    while position < length:
        match = _LATIN_RUN.match(text, position)
        if match is not None:
            n = match.end() - position
            total += 1 if n <= 8 else math.ceil(n / 4)
            position = match.end()
            joined = False
            continue
        char = text[position]
        position += 1
        if char.isspace():
            joined = False
            continue
        if char in _JOINERS:
            joined = True
            continue
        if joined or unicodedata.combining(char) or "\ufe00" <= char <= "\ufe0f":
            joined = False  # part of the previous grapheme
            continue
        total += 1
    return total


def within_all(bounds: list[tuple[Callable[[str], int], int]]) -> tuple[Callable[[str], int], int]:
    """One counter and budget that hold every ``(count, limit)`` bound at once.

    Returns ``(count, budget)`` with ``budget`` the smallest limit and ``count(text) <= budget``
    exactly when ``c(text) <= limit`` for every bound: each count is scaled to the budget and
    rounded up (``ceil(c * budget / limit) <= budget`` iff ``c <= limit``), and the largest wins.
    A chunker with one counter can thus keep chunks inside a model's window in its own word
    pieces and inside a size in KnowledgeFS's approximation.
    """
    if not bounds:
        raise ValueError("within_all needs at least one bound")
    budget = min(limit for _, limit in bounds)
    if len(bounds) == 1:
        return bounds[0]

    def count(text: str) -> int:
        return max(-(-c(text) * budget // limit) for c, limit in bounds)

    return count, budget
