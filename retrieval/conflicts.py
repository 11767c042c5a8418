"""Numeric conflicts between evidence items: the same quantity about the same subject given two
different values.

The rule is conservative, because a false ``conflict`` hides a right answer behind a warning
(a "15 MiB" upload limit is not contradicted by the 192 MiB of another setting, nor by an
example's 30 MiB). Two quantities, in sentences of two different items, disagree when all hold:

- **the same unit family** and **a different value**: sizes are compared in bytes (``B``, ``KB``,
  ``KiB``, ``MB``, ``MiB``, ``GB``, ``GiB``, ``TB``, ``TiB``, ``bytes``), durations in seconds
  (``ms``, ``s``, ``seconds``, ``minutes``, ``hours``, ``days``, ``weeks``), any other unit word
  only with itself (``days`` / ``days``, ``euros`` / ``euros``); so "15728640 bytes" and
  "15 MiB" agree;
- **the same subject near the value**: the question's terms within :data:`NEAR` words before or
  after the value and in its clause (up to a ``;``), the unit word excluded and a final ``s``
  ignored, share at least two terms (one when the question has only one other term);
- **the same setting**: when both sentences name a setting or key (an ``UPPER_SNAKE_CASE`` name
  or a ``code span``), the names nearest to the values are the same;
- **stated as fact**: a sentence that gives an example or a hypothesis ("for example", "e.g.",
  "such as", "if", "raising it to", "lowering it to") states no value of the subject and is
  left out.

Reason ``numeric_disagreement``, severity ``warning``. Nothing else is detected (negations,
dates written differently, numbers in words, paraphrased subjects are not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .sentences import split_sentences
from .text import keyword_terms

#: Words on each side of a value in which the question's terms name its subject.
NEAR = 6

# A number followed by its unit: "25 days", "3.5 %", "20天". The unit is a word (letters) or one
# CJK character; thousands separators are dropped.
_QUANTITY = re.compile(
    r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?(%|[A-Za-z]{1,}|[\u3400-\u9fff\u3040-\u30ff])"
    r"(?![A-Za-z])"
)
_WORDS = re.compile(r"\w+", re.UNICODE)
_KEY = re.compile(r"`([^`]{2,80})`|\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b")
_HYPOTHETICAL = re.compile(
    r"\b(?:for example|for instance|e\.g\.|such as|if|suppose|raising it|lowering it|"
    r"setting it to|would)\b",
    re.IGNORECASE,
)

_BYTES = {"b": 1, "byte": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}
_BYTES |= {"gb": 1000**3, "gib": 1024**3, "tb": 1000**4, "tib": 1024**4}
_SECONDS = {"ms": 0.001, "millisecond": 0.001, "s": 1, "sec": 1, "second": 1, "min": 60}
_SECONDS |= {"minute": 60, "h": 3600, "hour": 3600, "day": 86400, "week": 604800}
_SINGLE_LETTER_UNITS = {"b", "s", "h"}


def normal(term: str) -> str:
    """A term with a final ``s`` ignored (``days`` → ``day``), as the answer rules compare."""
    return term[:-1] if len(term) > 3 and term.endswith("s") else term


def unit_family(unit: str, number: str) -> tuple[str, float] | None:
    """``(family, value in the family's base unit)`` of a quantity; ``None`` for a one-letter
    word that is no unit ("3 a")."""
    word = normal(unit.lower()) if unit not in ("%",) else unit
    value = float(number)
    if word in _BYTES and unit != "b":  # a lower-case "b" is a word, "B" is bytes
        return "bytes", value * _BYTES[word]
    if word in _SECONDS:
        return "seconds", value * _SECONDS[word]
    if len(unit) == 1 and unit.isascii() and unit.isalpha():
        return None
    return word, value


@dataclass(frozen=True)
class Quantity:
    """One value in one sentence: what it is about (``subject``: the question's terms near it,
    ``key``: the nearest setting name, ``""`` if none) and its value (``family``, ``value``),
    with the text as written (``number``, ``unit``)."""

    subject: frozenset
    key: str
    family: str
    value: float
    number: str
    unit: str


def quantities(text: str, query_terms: set[str]) -> list[Quantity]:
    """The quantities of ``text`` stated as fact (module docstring), each with its subject."""
    found = []
    for sentence in split_sentences(text):
        if _HYPOTHETICAL.search(sentence):
            continue
        words = [(m.start(), normal(m.group(0).lower())) for m in _WORDS.finditer(sentence)]
        keys = [(m.start(), m.group(1) or m.group(2)) for m in _KEY.finditer(sentence)]
        for match in _QUANTITY.finditer(sentence):
            family = unit_family(match.group(2), match.group(1).replace(",", ""))
            if family is None:
                continue
            unit = normal(match.group(2).lower())
            index = next((i for i, (at, _) in enumerate(words) if at >= match.start()), 0)
            clause = _clause(sentence, match.start())
            window = [
                (at, w)
                for at, w in words[max(0, index - NEAR) : index + 2 + NEAR]
                if clause[0] <= at < clause[1]
            ]
            near = {w for _, w in window} & query_terms
            subject = frozenset(t for t in near if t != unit)
            key = min(keys, key=lambda k: abs(k[0] - match.start()))[1] if keys else ""
            number = match.group(1).replace(",", "")
            found.append(Quantity(subject, key, family[0], family[1], number, unit))
    return found


def _clause(sentence: str, at: int) -> tuple[int, int]:
    """The span of the clause around position ``at``: semicolons separate clauses."""
    start = sentence.rfind(";", 0, at) + 1
    end = sentence.find(";", at)
    return start, len(sentence) if end < 0 else end


def _query_terms(query: str) -> set[str]:
    return {normal(t) for t in keyword_terms(query) if not t.isdigit()}


def find_conflicts(evidence: list, query: str) -> None:
    """Record same-quantity, same-subject disagreements (module docstring) between items, on
    both of them: ``{reason, severity, with_node_id, detail}`` appended to ``item.conflicts``."""
    query_terms = _query_terms(query)
    # A quantity with no question term near it can never conflict: dropped at once.
    facts = [[q for q in quantities(item.text, query_terms) if q.subject] for item in evidence]
    for i, left in enumerate(evidence):
        if not facts[i]:
            continue
        for j in range(i + 1, len(evidence)):
            if not facts[j]:
                continue
            clash = _clash(facts[i], facts[j], query_terms)
            if clash is None:
                continue
            right = evidence[j]
            for item, peer in ((left, right), (right, left)):
                item.conflicts.append(
                    {
                        "reason": "numeric_disagreement",
                        "severity": "warning",
                        "with_node_id": peer.node_id,
                        "detail": clash,
                    }
                )


def _same_value(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)


def _clash(left: list[Quantity], right: list[Quantity], query_terms: set[str]) -> str | None:
    for a in left:
        needed = 1 if len(query_terms - {a.unit}) <= 1 else 2
        for b in right:
            if a.family != b.family or _same_value(a.value, b.value):
                continue
            if a.key and b.key and a.key != b.key:
                continue
            shared = a.subject & b.subject
            if len(shared) < needed:
                continue
            about = ", ".join(sorted(shared))
            if a.unit == b.unit:
                return f"{a.number} vs {b.number} {a.unit} ({about})"
            return f"{a.number} {a.unit} vs {b.number} {b.unit} ({about})"
    return None
