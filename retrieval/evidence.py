"""Evidence bundles: retrieval items packed into a model's window, with markers and answerability.

A retrieval result becomes :class:`EvidenceItem` values (node id, text, scores, citation and the
conflicts found among the items). :func:`pack` fits them into the evidence part of the model's
context window, in score order, giving markers ``[E1]``, ``[E2]``… in packing order, and lists
every omitted item with its reason. :func:`assess` sets the bundle's answerability state.

**The window** (docs/retrieval.md, "Answers"): ``context_tokens`` is the reasoning model's
context size from the Dify model catalog (``capabilities.model_properties.context_size`` or
``token_limits.context_size``), else ``KNOWLEDGE_ANSWER_CONTEXT_TOKENS`` (8,192). It is split into

- the system prompt and question: their approximate token count as sent;
- the output reservation: ``min(KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS (1,024), context / 4)``;
- the safety margin: ``max(context / 20, 64)`` tokens (5 %: the token count is approximate);
- the evidence budget: what remains.

Evidence is packed best score first: at most :data:`MAX_ITEMS` (128) items and
:data:`MAX_CHARS` (200,000) characters of evidence text (reference inventory §5.7). An item that
does not fit is omitted with reason ``over_budget`` (tokens or characters, named in ``budget``)
and packing goes on with the next, smaller items; items past the 128th are ``item_limit``.

**Token approximation** (inventory §5.7): whitespace is free; a run of Latin letters and digits
of at most 8 characters is 1 token, a longer run ``ceil(n / 4)``; every other grapheme (CJK,
kana, Hangul, other scripts, punctuation, symbols) is 1. A grapheme is approximated as a code
point with the combining marks, variation selectors and zero-width-joined code points that follow
it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.conf import settings

from ingestion.tokens import approx_tokens

from .conflicts import find_conflicts, normal
from .sentences import (  # noqa: F401 - used as ev.*
    sentences_with_kind,
    split_sentences,
    table_row_sentences,
)
from .text import keyword_terms, keyword_text

MAX_ITEMS = 128  # inventory §5.7: at most 128 packed evidence items
MAX_CHARS = 200_000  # inventory §5.7: at most 200,000 characters of evidence
SAFETY_SHARE = 0.05  # 5 % of the window: the token count is an approximation
MIN_SAFETY_TOKENS = 64
OUTPUT_SHARE = 0.25  # the output reservation never takes more than a quarter of the window

ANSWERABLE = "answerable"
PARTIAL = "partial"
NOT_ENOUGH = "not-enough-evidence"
CONFLICT = "conflict"
PERMISSION_LIMITED = "permission-limited"
STATES = (ANSWERABLE, PARTIAL, NOT_ENOUGH, CONFLICT, PERMISSION_LIMITED)

# Marker-shaped text inside evidence: what the citation normaliser would read as a marker.
_EVIDENCE_MARKER = re.compile(r"\[(E\d+)\]")
# Fullwidth square brackets (U+FF3B, U+FF3D): ``[E2]`` from a document is shown as ``［E2］``.
NEUTRAL_OPEN, NEUTRAL_CLOSE = "\uff3b", "\uff3d"

_WORD = re.compile(r"\w+", re.UNICODE)


def neutralise_markers(text: str) -> str:
    """``text`` with every marker-shaped ``[E<digits>]`` written with fullwidth brackets
    (``[E2]`` → ``［E2］``), so text quoted from a document can neither forge a citation nor lose
    its own ``[E9]`` to the citation normaliser; the quote stays visible and readable. Applied to
    the evidence an LLM is given and to the sentences of an extractive answer; the evidence
    ``text`` returned to the client stays the document's own."""
    return _EVIDENCE_MARKER.sub(lambda m: f"{NEUTRAL_OPEN}{m.group(1)}{NEUTRAL_CLOSE}", text)


@dataclass
class EvidenceItem:
    """One piece of evidence: a retrieval item with its conflicts and, once packed, its marker.

    ``score`` is the retrieval's final score (0..1), ``scores`` its per-stage scores,
    ``citation`` ``{document_id, filename, page_number, section_path, start_offset,
    end_offset}``, ``conflicts`` ``[{reason, severity info|warning|blocking, with_node_id,
    detail}]``; ``marker`` is ``"E1"``… (``None`` while unpacked).
    """

    node_id: str
    text: str
    score: float
    scores: dict
    citation: dict
    conflicts: list[dict] = field(default_factory=list)
    marker: str | None = None

    @property
    def label(self) -> str:
        """``[E1]``: how the answer cites this item."""
        return f"[{self.marker}]"

    def as_dict(self) -> dict:
        return {
            "marker": self.label if self.marker else None,
            "node_id": self.node_id,
            "text": self.text,
            "citation": self.citation,
            "score": round(self.score, 6),
            "scores": {k: round(v, 6) for k, v in self.scores.items()},
            "conflicts": self.conflicts,
        }


@dataclass
class Window:
    """The split of one model window, in approximate tokens (see the module docstring).

    ``source`` says where ``context_tokens`` came from: ``catalog`` or ``setting``.
    """

    context_tokens: int
    source: str
    prompt_tokens: int
    output_tokens: int
    safety_tokens: int

    @property
    def evidence_tokens(self) -> int:
        return max(
            self.context_tokens - self.prompt_tokens - self.output_tokens - self.safety_tokens, 0
        )

    def as_dict(self) -> dict:
        return {
            "context_tokens": self.context_tokens,
            "context_source": self.source,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "safety_tokens": self.safety_tokens,
            "evidence_tokens": self.evidence_tokens,
        }


def window(context_tokens: int, prompt: str, *, source: str = "setting") -> Window:
    """Split a ``context_tokens`` window for a prompt (system prompt + question) of ``prompt``."""
    output = min(settings.KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS, int(context_tokens * OUTPUT_SHARE))
    safety = max(int(context_tokens * SAFETY_SHARE), MIN_SAFETY_TOKENS)
    return Window(context_tokens, source, approx_tokens(prompt), output, safety)


@dataclass
class Bundle:
    """Packed evidence: ``items`` (with markers, packing order), ``omitted`` (``[{node_id,
    score, reason over_budget|item_limit, budget?}]``), the ``window`` used, totals, and the
    ``answerability`` state once :func:`assess` ran (``reasons`` say why)."""

    items: list[EvidenceItem]
    omitted: list[dict]
    window: Window
    used_tokens: int = 0
    used_chars: int = 0
    answerability: str = NOT_ENOUGH
    reasons: list[str] = field(default_factory=list)
    # Set by assess: the request's own filters left out every document (no evidence at all).
    filters_matched_nothing: bool = False

    def by_marker(self) -> dict[str, EvidenceItem]:
        return {item.label: item for item in self.items}

    def summary(self) -> dict:
        """What an answer trace keeps: counts, budgets and state, never evidence text."""
        return {
            "packed": len(self.items),
            "omitted": [{k: v for k, v in o.items()} for o in self.omitted],
            "used_tokens": self.used_tokens,
            "used_chars": self.used_chars,
            "window": self.window.as_dict(),
            "answerability": self.answerability,
            "reasons": self.reasons,
        }


def from_retrieval(items, query: str) -> list[EvidenceItem]:
    """Turn retrieval items (``node_id, score, text, citation, scores``) into evidence items,
    best score first, each with the conflicts :func:`find_conflicts` detects for ``query``."""
    evidence = [
        EvidenceItem(
            node_id=str(item.node_id),
            text=item.text,
            score=float(item.score),
            scores=dict(item.scores),
            citation=dict(item.citation),
        )
        for item in items
    ]
    evidence.sort(key=lambda e: -e.score)  # stable: retrieval order breaks ties
    find_conflicts(evidence, query)
    return evidence


def entry_text(item: EvidenceItem) -> str:
    """How one item appears in the prompt: ``[E1] (filename, p. 3, Section › Sub)`` then text."""
    c = item.citation
    where = [c.get("filename") or "document"]
    if c.get("page_number"):
        where.append(f"p. {c['page_number']}")
    if c.get("section_path"):
        where.append(" › ".join(c["section_path"]))
    # A filename or heading may hold marker-shaped text too: neutralised like the text.
    where_text = neutralise_markers(", ".join(where))
    return f"{item.label} ({where_text})\n{neutralise_markers(item.text)}\n"


def pack(evidence: list[EvidenceItem], win: Window) -> Bundle:
    """Pack ``evidence`` (best first) into ``win``'s evidence budget; see the module docstring.

    Markers are assigned in packing order; an omitted item keeps ``marker=None``.
    """
    packed: list[EvidenceItem] = []
    omitted: list[dict] = []
    tokens = chars = 0
    for item in evidence:
        if len(packed) >= MAX_ITEMS:
            omitted.append(_omission(item, "item_limit"))
            continue
        item.marker = f"E{len(packed) + 1}"
        cost = approx_tokens(entry_text(item))
        if chars + len(item.text) > MAX_CHARS:
            item.marker = None
            omitted.append(_omission(item, "over_budget", "characters"))
            continue
        if tokens + cost > win.evidence_tokens:
            item.marker = None
            omitted.append(_omission(item, "over_budget", "tokens"))
            continue
        packed.append(item)
        tokens += cost
        chars += len(item.text)
    return Bundle(items=packed, omitted=omitted, window=win, used_tokens=tokens, used_chars=chars)


def _omission(item: EvidenceItem, reason: str, budget: str | None = None) -> dict:
    entry = {"node_id": item.node_id, "score": round(item.score, 6), "reason": reason}
    if budget is not None:
        entry["budget"] = budget
    return entry


# --- answerability -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Removals:
    """What a retrieval reports as removed before ranking: ``permission`` (candidates removed by
    permissions: ``metrics.permission_filtered_candidates``, else the ``filtered_count`` of a
    stage named ``permission``), ``filtered`` (documents the request's own filters left out:
    the ``filter``/``filters`` stage's ``filtered_count``, else
    ``metrics.metadata_filtered_candidates``) and ``considered`` (documents the filter looked
    at: the stage's ``candidate_count``)."""

    permission: int = 0
    filtered: int = 0
    considered: int = 0

    @property
    def filters_matched_nothing(self) -> bool:
        """The request's filters left out every document they looked at."""
        return self.filtered > 0 and self.filtered >= self.considered


def removals(result) -> Removals:
    """The :class:`Removals` a retrieval result reports (all ``0`` when it reports none)."""
    metrics = getattr(result, "metrics", None) or {}
    stages = [s for s in getattr(result, "stages", None) or [] if isinstance(s, dict)]
    permission = int(metrics.get("permission_filtered_candidates") or 0) or sum(
        int(s.get("filtered_count") or 0) for s in stages if s.get("name") == "permission"
    )
    filter_stages = [s for s in stages if s.get("name") in ("filter", "filters")]
    filtered = sum(int(s.get("filtered_count") or 0) for s in filter_stages) or int(
        metrics.get("metadata_filtered_candidates") or 0
    )
    considered = sum(int(s.get("candidate_count") or 0) for s in filter_stages) or filtered
    return Removals(permission, filtered, considered)


def terms_of(text: str) -> set[str]:
    """The lower-case words of ``text`` (CJK runs as bigrams, a final ``s`` ignored): what
    sentence selection and the answerability rule compare with the query's terms."""
    return {normal(w) for w in _WORD.findall(keyword_text(text).lower())}


def query_terms(query: str) -> set[str]:
    """The query's terms: :func:`retrieval.text.keyword_terms` (stop words dropped, CJK
    bigrams), normalised like :func:`terms_of`."""
    return {normal(t) for t in keyword_terms(query)}


def coverage(query_words: set[str], text: str) -> float:
    """The share (0..1) of ``query_words`` (:func:`query_terms`) that ``text`` contains."""
    if not query_words:
        return 0.0
    return len(query_words & terms_of(text)) / len(query_words)


def relevance(item: EvidenceItem) -> tuple[str, float] | None:
    """An item's absolute relevance signal, ``(name, value)``: the reranker's score
    (``scores["rerank"]``) when a reranker ran, else the raw cosine between the query and the
    item from the dense leg (``scores["dense_raw"]``); ``None`` when the item has neither (a
    keyword-only hit, a Deep expansion). Fused scores are min-max normalised per query, so they
    are relative and never used here."""
    for name in ("rerank", "dense_raw"):
        value = item.scores.get(name)
        if isinstance(value, int | float):
            return name, float(value)
    return None


def _strong(item: EvidenceItem, fallback: bool, min_similarity: float) -> bool:
    """Related by meaning: the reranker's score ≥ ``KNOWLEDGE_ANSWER_MIN_FINAL_SCORE``, else
    the raw dense cosine ≥ ``min_similarity`` (:func:`dense_floor`). An item with neither
    signal is strong only with ``fallback`` (no packed item has one: a keyword-only space) and
    a final score ≥ ``KNOWLEDGE_ANSWER_MIN_FINAL_SCORE``; a Deep expansion beside hits that have
    a signal is never strong by its relative score."""
    signal = relevance(item)
    if signal is None and not fallback:
        return False
    if signal is None or signal[0] == "rerank":
        value = item.score if signal is None else signal[1]
        return value >= settings.KNOWLEDGE_ANSWER_MIN_FINAL_SCORE
    return signal[1] >= min_similarity


def dense_floor(model: object | None = None) -> float:
    """The raw cosine from which an item counts as related by meaning: the embedding model's
    own calibrated ``relevance_floor`` (the local models carry one: cosines of two models are
    not on one scale), else ``KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY`` (models served through
    Dify)."""
    floor = getattr(model, "relevance_floor", None)
    if isinstance(floor, int | float):
        return float(floor)
    return settings.KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY


def assess(
    bundle: Bundle,
    *,
    query: str | None = None,
    removed: Removals | None = None,
    min_similarity: float | None = None,
) -> Bundle:
    """Set ``bundle.answerability`` (and ``reasons``) by these rules, first match wins
    (docs/retrieval.md, "Answerability"; the figures behind the defaults are there):

    1. nothing packed and permissions removed candidates (``removed.permission``) →
       ``permission-limited``;
    2. nothing packed → ``not-enough-evidence`` (the reason says when the request's own
       filters matched nothing);
    3. two packed items disagree (:func:`find_conflicts`) → ``conflict``;
    4. an item is *strong* (related by meaning, :func:`_strong`: an absolute signal, never the
       relative fused score) and *covered* (it holds at least
       ``KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE`` of the query's content words), and at least
       ``KNOWLEDGE_ANSWER_MIN_ITEMS`` items are strong → ``answerable``;
    5. no item is strong and none holds that share of the query's words →
       ``not-enough-evidence`` (the evidence is about something else; the answer is then the
       explicit message, never a sentence of it);
    6. otherwise → ``partial``: related by meaning or by words, not both (or too few strong
       items).

    Without ``query`` every item counts as covered (the lexical condition is off). The dense
    cosine's floor is ``min_similarity`` (the model's, :func:`dense_floor`), else the setting.
    """
    removed = removed or Removals()
    floor = dense_floor() if min_similarity is None else min_similarity
    minimum_cover = settings.KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE
    words = query_terms(query) if query is not None else set()
    fallback = not any(relevance(i) for i in bundle.items)
    strong = [i for i in bundle.items if _strong(i, fallback, floor)]
    covers = {i.node_id: coverage(words, i.text) if words else 1.0 for i in bundle.items}
    covered = [i for i in bundle.items if covers[i.node_id] >= minimum_cover]
    packed = {i.node_id for i in bundle.items}
    conflicts = sorted(
        {c["detail"] for i in bundle.items for c in i.conflicts if c["with_node_id"] in packed}
    )
    bundle.filters_matched_nothing = removed.filters_matched_nothing
    if not bundle.items and removed.permission > 0:
        bundle.answerability = PERMISSION_LIMITED
        bundle.reasons = [f"{removed.permission} candidates were removed by permissions"]
    elif not bundle.items:
        bundle.answerability = NOT_ENOUGH
        bundle.reasons = [
            f"the request's filters matched none of the {removed.considered} documents"
            if removed.filters_matched_nothing
            else "no evidence passed retrieval, its threshold and the window"
        ]
    elif conflicts:
        bundle.answerability = CONFLICT
        bundle.reasons = conflicts
    elif len(strong) >= settings.KNOWLEDGE_ANSWER_MIN_ITEMS and _both(strong, covered):
        bundle.answerability = ANSWERABLE
        bundle.reasons = [_signal_reason(bundle.items, strong, covers, words, floor)]
    elif not strong and not covered:
        bundle.answerability = NOT_ENOUGH
        bundle.reasons = [
            "no evidence is about the question: "
            + _signal_reason(bundle.items, [], covers, words, floor)
        ]
    else:
        bundle.answerability = PARTIAL
        bundle.reasons = [_partial_reason(strong, covered, words)]
    return bundle


def _signal_reason(items, strong, covers: dict, words: set[str], floor: float) -> str:
    """``best dense_raw 0.61 (at least 0.33 needed), 4 of 6 question words in one item``."""
    pool = strong or items

    def strength(item: EvidenceItem) -> float:
        signal = relevance(item)
        return signal[1] if signal else item.score

    best = max(pool, key=strength)
    signal = relevance(best)
    if signal is None:
        name, value, needed = "score", best.score, settings.KNOWLEDGE_ANSWER_MIN_FINAL_SCORE
    elif signal[0] == "rerank":
        name, value, needed = "rerank", signal[1], settings.KNOWLEDGE_ANSWER_MIN_FINAL_SCORE
    else:
        name, value, needed = "dense_raw", signal[1], floor
    share = max(covers.values(), default=0.0)
    held = round(share * len(words))
    return (
        f"best {name} {value:.2f} ({needed:.2f} needed), "
        f"{held} of {len(words)} question words in one item "
        f"({settings.KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE:.0%} needed)"
    )


def _both(strong, covered) -> bool:
    return bool({i.node_id for i in strong} & {i.node_id for i in covered})


def _partial_reason(strong, covered, words: set[str]) -> str:
    if strong and not covered:
        return "evidence is related by meaning but holds too few words of the question"
    if covered and not strong:
        return "evidence shares words with the question but is not related by meaning"
    if not _both(strong, covered):
        return "no single item is both related by meaning and holds the question's words"
    return (
        f"{len(strong)} items are related by meaning; {settings.KNOWLEDGE_ANSWER_MIN_ITEMS} needed"
    )
