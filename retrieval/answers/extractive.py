"""Extractive answers (no reasoning model): the sentences of the packed evidence that carry what
the question asks, each followed by its marker."""

from __future__ import annotations

from collections.abc import Generator

from django.conf import settings

from retrieval import evidence as ev
from retrieval.text import STOP_WORDS

from .state import AnswerRun

#: Question words: they ask, they name no subject (a final ``s`` ignored, as the terms are).
QUESTION_WORDS = frozenset(
    {"what", "which", "who", "whom", "whose", "when", "where", "why", "how", "many", "much",
     "doe", "do", "did", "may", "can", "could", "would", "should", "is", "are", "be", "get"}
)  # fmt: skip

#: Words by which a question asks for a quantity (a final ``s`` ignored): such a question is
#: answered by a sentence that states one, so among equally matching sentences those holding a
#: number lead.
QUANTITY_WORDS = frozenset(
    {"limit", "size", "maximum", "max", "minimum", "min", "many", "much", "long", "large",
     "big", "number", "count", "timeout", "capacity", "length"}
)  # fmt: skip

NO_SENTENCE_MESSAGE = (
    "No sentence of the evidence states what the question asks: the closest passages are "
    "listed as evidence."
)


def answer_sentences(text: str, headings=()) -> list[str]:
    """The sentences of an evidence text an extractive answer may quote: marker-shaped text
    neutralised (:func:`retrieval.evidence.neutralise_markers`), wrapped lines rejoined and
    headings left out (:mod:`retrieval.sentences`: ``headings`` is the item's section path);
    sentences of fewer than 3 approximate tokens are headings too, unless the text has no longer
    sentence (a short chunk: a table cell, a one-line answer), whose sentences are all kept."""
    sentences = [
        s
        for heading, s in ev.sentences_with_kind(ev.neutralise_markers(text), headings)
        if not heading
    ]
    return [s for s in sentences if ev.approx_tokens(s) >= 3] or sentences


def subject_terms(query: str) -> set[str]:
    """The question's content words: :func:`retrieval.evidence.query_terms` without question
    words (what, how, many, does…); all of them when nothing else is left."""
    wanted = ev.query_terms(query)
    return {t for t in wanted if t not in QUESTION_WORDS} or wanted


def carries_content(sentence: str, wanted: set[str]) -> bool:
    """A sentence can answer when it holds at least one of the question's content words and at
    least one word the question does not have (it says something: it is not the question's own
    words again), and does not only announce what follows (a lead-in ending with ``:``)."""
    terms = ev.terms_of(sentence)
    if not wanted & terms or sentence.rstrip().endswith(":"):
        return False
    return any(t not in wanted and t not in STOP_WORDS and t not in QUESTION_WORDS for t in terms)


def extract(bundle: ev.Bundle, query: str, limit: int) -> list[tuple[str, str]]:
    """The extractive answer: up to ``limit`` ``(sentence, marker)`` pairs, best first.

    Candidates are the sentences (:func:`answer_sentences`) that carry content
    (:func:`carries_content`); a heading, a sentence without a content word of the question, a
    sentence made only of the question's words and a lead-in are never the answer. A candidate
    scores the share of the question's content words (:func:`subject_terms`, CJK as bigrams, a
    final ``s`` ignored) it contains; kept: those scoring at least half the best score, ties in
    evidence order, each distinct sentence once; sentences of prose before those of Markdown
    table rows (:func:`retrieval.sentences.table_row_sentences`), which only follow; when the
    question asks for a quantity (:data:`QUANTITY_WORDS`), a sentence holding a number leads
    over one that matches as well without any. No
    candidate: ``[]`` (the answer is then :data:`NO_SENTENCE_MESSAGE`, never a sentence about
    something else).
    """
    wanted = subject_terms(query)
    quantity = bool(ev.terms_of(query) & QUANTITY_WORDS)
    scored = []
    for rank, item in enumerate(bundle.items):
        headings = item.citation.get("section_path") or ()
        rows = ev.table_row_sentences(ev.neutralise_markers(item.text), headings)
        for position, sentence in enumerate(answer_sentences(item.text, headings)):
            if not carries_content(sentence, wanted):
                continue
            share = len(wanted & ev.terms_of(sentence)) / len(wanted)
            states = quantity and any(c.isdigit() for c in sentence)
            scored.append((share, sentence in rows, not states, rank, position, sentence,
                           item.label))  # fmt: skip
    if not scored:
        return []
    best = max(s[0] for s in scored)
    # Prose first among the kept: a sentence that answers leads over a table row that matches
    # as well (a catalogue's cells name many things; the row follows as further evidence).
    scored = [s for s in scored if s[0] >= best / 2]
    scored.sort(key=lambda s: (s[1], -s[0], s[2], s[3], s[4]))
    chosen: list[tuple[str, str]] = []
    seen: set[str] = set()
    for *_, sentence, label in scored:
        if len(chosen) >= limit:
            break
        if sentence in seen:
            continue
        seen.add(sentence)
        chosen.append((sentence, label))
    return chosen


def _extractive_deltas(run: AnswerRun) -> Generator[str, None, None]:
    pairs = extract(run.bundle, run.query, settings.KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES)
    if not pairs:
        if run.bundle.answerability == ev.ANSWERABLE:
            # The documented rule: an answer needs a sentence that says what is asked; the
            # items' scores alone do not make the evidence an answer.
            run.bundle.answerability = ev.PARTIAL
            run.bundle.reasons = run.bundle.reasons + [
                "no sentence of the evidence holds the question's words and says something "
                "more (headings, lead-ins and the question's own words are not answers)"
            ]
        yield NO_SENTENCE_MESSAGE
        return
    for n, (sentence, label) in enumerate(pairs):
        yield ("" if n == 0 else " ") + f"{sentence} {label}"
