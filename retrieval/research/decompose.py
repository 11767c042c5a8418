"""The deterministic path's local decomposition of a compound question into sub-queries."""

from __future__ import annotations

import re

from .. import reasoning

_QUESTION_BREAK = re.compile(r"(?<=[?？])\s*|[;；\n]+")
_CLAUSE_AND = re.compile(
    r"\s*,?\s+and\s+(?=(?:what|how|why|when|where|which|who|whom|whose|is|are|was|were|does|do|"
    r"did|can|could|should|would|will|has|have)\b)",
    re.IGNORECASE,
)
_VERSUS = re.compile(r"\s+(?:vs\.?|versus)\s+", re.IGNORECASE)
_BETWEEN = re.compile(r"\bdifferences?\s+between\s+(.+?)\s+and\s+(.+)$", re.IGNORECASE)
_COMPARE = re.compile(r"^\s*compare\s+(.+?)\s+(?:and|with|to)\s+(.+)$", re.IGNORECASE)
_WORD = re.compile(r"\w{2,}")


def decompose(query: str, limit: int = reasoning.MAX_SUB_QUERIES) -> list[str]:
    """Split a compound question into at most ``limit`` sub-queries; ``[]`` for a simple one.

    The rule, applied in order: (1) break on ``?``/``？`` (after it), ``;``/``；`` and line
    breaks; (2) inside each piece, break on ``and`` (or ``, and``) followed by a question word
    or an auxiliary verb (``what``, ``how``, ``why``, ``is``, ``does``, ``can``…: the start of
    a new clause, not a noun phrase like "salt and pepper"); (3) a comparison becomes its two
    sides: ``X vs Y`` / ``X versus Y``, ``compare X and|with|to Y``, ``difference(s) between X
    and Y``. Pieces without a word of two or more characters are dropped, duplicates (case
    ignored) too. Fewer than two pieces means no sub-queries; more than ``limit`` keeps the
    first ``limit``.
    """
    pieces: list[str] = []
    for part in _QUESTION_BREAK.split(query):
        for clause in _CLAUSE_AND.split(part):
            pieces.extend(_comparison(clause) or [clause])
    seen: set[str] = set()
    result: list[str] = []
    for piece in pieces:
        text = " ".join(piece.strip(" ,.").split())
        key = text.casefold()
        if not _WORD.search(text) or key in seen:
            continue
        seen.add(key)
        result.append(text)
    if len(result) < 2:
        return []
    return result[:limit]


def _comparison(clause: str) -> list[str] | None:
    sides = _VERSUS.split(clause.strip().rstrip("?？. "))
    if len(sides) >= 2:
        return sides
    for pattern in (_COMPARE, _BETWEEN):
        match = pattern.search(clause.strip().rstrip("?？. "))
        if match:
            return [match.group(1), match.group(2)]
    return None
