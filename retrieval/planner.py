"""The retrieval planner (``retrieval-planner-v1``): how deep each leg reads, how many candidates
are fused and reranked, and the query's language.

Figures (inventory §5.2), with ``top_k`` the request's and the multipliers of
:data:`RECALL_MULTIPLIER` / :data:`FUSION_MULTIPLIER`
(Fast 1/1, Deep 5/3, Research 10/5):

- ``dense_top_k = fts_top_k = min(max(top_k × recall, 50), 100)``: the formula
  ``min(top_k × recall, 100)`` with our measured floor of 50 candidates per leg
  (docs/benchmarks.md, "Candidates per leg": nDCG@10 0.7068 → 0.7202 on SciFact); the plan
  reports the floor as ``leg_floor``;
- ``fusion_limit = rerank_limit = min(top_k × fusion, 100)``: how many fused candidates go on
  (to the reranker when the profile enables one, to Deep's context expansion otherwise).

The cap 100 is ``RETRIEVAL_MAX_TOP_K``. The language rule is :func:`detect_language`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass

from django.conf import settings

from .text import is_cjk

PLANNER_VERSION = "retrieval-planner-v1"
#: Each leg reads at least this many candidates (docs/benchmarks.md, "Candidates per leg").
LEG_FLOOR = 50
LANGUAGES = ("cjk", "latin", "mixed-cjk-latin", "other")
RECALL_MULTIPLIER = {"fast": 1, "deep": 5, "research": 10}
# Rerank candidates: min(top_k × FUSION_MULTIPLIER, RETRIEVAL_MAX_TOP_K).
FUSION_MULTIPLIER = {"fast": 1, "deep": 3, "research": 5}


@dataclass(frozen=True)
class Plan:
    """One request's retrieval plan; :meth:`as_dict` is what responses show under ``plan``.

    ``dense_top_k``/``fts_top_k`` are the candidates each leg reads (floor applied);
    ``fusion_limit``/``rerank_limit`` the fused candidates kept; ``query_language`` one of
    :data:`LANGUAGES`.
    """

    version: str
    mode: str
    top_k: int
    recall_multiplier: int
    fusion_multiplier: int
    dense_top_k: int
    fts_top_k: int
    leg_floor: int
    fusion_limit: int
    rerank_limit: int
    query_language: str

    def as_dict(self) -> dict:
        return asdict(self)


def plan(mode: str, top_k: int, query: str) -> Plan:
    """Plan a ``fast``, ``deep`` or ``research`` retrieval of ``top_k`` items for ``query``.

    ``mode`` must be concrete (``auto`` resolves first) and ``top_k`` already validated
    (1..``RETRIEVAL_MAX_TOP_K``); raises ``KeyError`` for another mode.
    """
    cap = settings.RETRIEVAL_MAX_TOP_K
    recall, fusion = RECALL_MULTIPLIER[mode], FUSION_MULTIPLIER[mode]
    leg = min(max(top_k * recall, LEG_FLOOR), cap)
    limit = min(top_k * fusion, cap)
    return Plan(
        version=PLANNER_VERSION,
        mode=mode,
        top_k=top_k,
        recall_multiplier=recall,
        fusion_multiplier=fusion,
        dense_top_k=leg,
        fts_top_k=leg,
        leg_floor=LEG_FLOOR,
        fusion_limit=limit,
        rerank_limit=limit,
        query_language=detect_language(query),
    )


def detect_language(text: str) -> str:
    """The query's script family, from the Unicode scripts of its letters.

    Only letters count (``str.isalpha``; digits, spaces and punctuation are ignored). A letter is
    CJK when it is Han, Hiragana, Katakana (halfwidth too) or Hangul (the ranges of
    :mod:`retrieval.text`, the ones the keyword index turns into bigrams), Latin when its
    Unicode name starts with ``LATIN``, else other. Rule: CJK and Latin letters both present →
    ``mixed-cjk-latin``; CJK present → ``cjk``; Latin letters present and at least as many as
    other letters → ``latin``; anything else (Cyrillic, Arabic, no letters at all) → ``other``.
    """
    cjk = latin = other = 0
    for char in text:
        if not char.isalpha():
            continue
        if char.isascii():  # A–Z, a–z: Latin, without the name lookup
            latin += 1
        elif is_cjk(char):
            cjk += 1
        elif unicodedata.name(char, "").startswith("LATIN"):
            latin += 1
        else:
            other += 1
    if cjk and latin:
        return "mixed-cjk-latin"
    if cjk:
        return "cjk"
    if latin and latin >= other:
        return "latin"
    return "other"
