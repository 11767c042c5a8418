"""Extractive answers (no reasoning model): the best supporting sentences of the packed
evidence, each followed by its marker."""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings

from retrieval import evidence as ev

from .state import AnswerRun


def answer_sentences(text: str) -> list[str]:
    """The sentences of an evidence text an extractive answer may quote: marker-shaped text
    neutralised (:func:`retrieval.evidence.neutralise_markers`), then split; sentences of fewer
    than 3 approximate tokens are headings and skipped, unless the text has no longer sentence
    (a short chunk: a table cell, a one-line answer), whose sentences are all kept."""
    sentences = ev.split_sentences(ev.neutralise_markers(text))
    return [s for s in sentences if ev.approx_tokens(s) >= 3] or sentences


def extract(bundle: ev.Bundle, query: str, limit: int) -> list[tuple[str, str]]:
    """The extractive answer: up to ``limit`` ``(sentence, marker)`` pairs, best first.

    A sentence (:func:`answer_sentences`) scores the share of the query's terms
    (:func:`retrieval.text.keyword_terms`, CJK as bigrams, a final ``s`` ignored) it contains;
    kept: those scoring at least half the best score, ties in evidence order, each distinct
    sentence once. When no sentence shares a term with the query (a paraphrase found by the
    dense leg), the first sentence of the best item (``[E1]``) is the answer; see
    :func:`is_fallback`.
    """
    wanted = ev.query_terms(query)
    scored = []
    for rank, item in enumerate(bundle.items):
        for position, sentence in enumerate(answer_sentences(item.text)):
            share = len(wanted & ev.terms_of(sentence)) / len(wanted) if wanted else 0.0
            if share > 0:
                scored.append((share, rank, position, sentence, item.label))
    if not scored:
        for item in bundle.items:  # the best item first; an empty text gives no sentence
            sentences = answer_sentences(item.text)
            if sentences:
                return [(sentences[0], item.label)]
        return []
    best = max(s[0] for s in scored)
    scored.sort(key=lambda s: (-s[0], s[1], s[2]))
    chosen: list[tuple[str, str]] = []
    seen: set[str] = set()
    for share, _, _, sentence, label in scored:
        if share < best / 2 or len(chosen) >= limit:
            break
        if sentence in seen:
            continue
        seen.add(sentence)
        chosen.append((sentence, label))
    return chosen


def is_fallback(pairs: list[tuple[str, str]], query: str) -> bool:
    """True when an extractive answer shares no term with the query (the fallback sentence)."""
    wanted = ev.query_terms(query)
    return bool(pairs) and not any(wanted & ev.terms_of(sentence) for sentence, _ in pairs)


def _extractive_deltas(run: AnswerRun) -> Iterator[str]:
    pairs = extract(run.bundle, run.query, settings.KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES)
    if is_fallback(pairs, run.query) and run.bundle.answerability == ev.ANSWERABLE:
        # The documented rule: an answer no sentence of which holds a word of the question is
        # partial, whatever the items' scores said.
        run.bundle.answerability = ev.PARTIAL
        run.bundle.reasons = run.bundle.reasons + [
            "no sentence of the evidence holds a word of the question: the best item's first "
            "sentence is the answer"
        ]
    for n, (sentence, label) in enumerate(pairs):
        yield ("" if n == 0 else " ") + f"{sentence} {label}"
