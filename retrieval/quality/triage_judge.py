"""Triage's reasoning-model judge: one more independent signal for a failed query, asked of the
space's reasoning model when its retrieval profile names one (docs/quality.md, "Triage").

The model gets the question, the space's document names and the best keyword-only hits (both
inside an untrusted block: data, never instructions) and answers one strict JSON object
``{"verdict": "retrieval-miss" | "coverage-gap" | "irrelevant" | "uncertain", "reason": "…"}``
(:data:`VERDICT`, checked by :mod:`retrieval.reasoning`: unknown keys, another verdict or an
over-long reason are refused). The call is bounded by ``KNOWLEDGE_QUALITY_TRIAGE_JUDGE_TIMEOUT_MS``
(never above the reasoning deadline). A malformed answer, a timeout or an outage never fails the
triage: :func:`judge` returns no verdict and the reason, and the row is labelled by the other
signals (:func:`combine`).

:func:`combine` leans to ``uncertain``: the same verdict stands; one side ``uncertain`` lets the
other decide, except that the model alone never dismisses a row (``irrelevant`` closes it: the
keyword signals must agree); two different decided verdicts give ``uncertain``.
"""

from __future__ import annotations

from django.conf import settings

from retrieval import reasoning

VERDICTS = ("retrieval-miss", "coverage-gap", "irrelevant", "uncertain")
MAX_REASON = 300
MAX_HITS = 5
MAX_HIT_CHARS = 600
MAX_NAMES = 50

VERDICT = reasoning.Schema(
    "triage",
    (
        reasoning.Field(
            "verdict",
            "enum",
            "retrieval-miss: the data holds the answer but it was not retrieved; coverage-gap: "
            "the question is on the knowledge base's topic but the data does not hold the "
            "answer; irrelevant: the question has nothing to do with this knowledge base; "
            "uncertain: you cannot tell",
            choices=VERDICTS,
        ),
        reasoning.Field("reason", "str", "why, in one sentence", max_chars=MAX_REASON),
    ),
)
TASK = (
    "You triage a question that a knowledge base failed to answer well. Decide from the "
    "question, the knowledge base's document names and the passages a keyword search found "
    "whether the knowledge base holds the answer."
)


def selection_of(space):
    """The space's reasoning model (:class:`spaces.profiles.Selection`), or ``None``."""
    from spaces.readiness import require_servable

    return reasoning.reasoning_selection(require_servable(space))


def prompt(query: str, names: list[str], hits: list[str]) -> reasoning.Prompt:
    block = reasoning.untrusted_block(
        [f"document name: {n}" for n in names[:MAX_NAMES]]
        + [f"passage: {h[:MAX_HIT_CHARS]}" for h in hits[:MAX_HITS]]
    )
    user = (
        f"Question: {query}\n\nDocument names and keyword-search passages of the knowledge "
        f"base:\n{block.text}"
    )
    return reasoning.Prompt(reasoning.system_prompt(TASK, VERDICT), user, VERDICT)


def judge(space, selection, query: str, names: list[str], hits: list[str]) -> dict:
    """``{model, verdict, reason, duration_ms}`` from the model, or ``{model, verdict: None,
    error, reason}`` when it timed out, failed or answered outside the schema."""
    timeout_ms = settings.KNOWLEDGE_QUALITY_TRIAGE_JUDGE_TIMEOUT_MS
    model = str(selection)
    try:
        answer = reasoning.ask(space, selection, prompt(query, names, hits), timeout_ms=timeout_ms)
    except reasoning.ReasoningError as exc:
        return {
            "model": model,
            "verdict": None,
            "error": exc.code,
            "reason": f"{exc.message}; labelled by the keyword and title signals",
        }
    return {
        "model": model,
        "verdict": answer.output["verdict"],
        "reason": answer.output["reason"],
        "duration_ms": answer.duration_ms,
    }


def combine(signal_verdict: str, judge_verdict: str | None) -> tuple[str, str]:
    """``(verdict, rule)`` of the keyword signals' verdict and the model's (``None``: no
    answer)."""
    if judge_verdict is None:
        return signal_verdict, "signals-only"
    if judge_verdict == signal_verdict:
        return signal_verdict, "agree"
    if signal_verdict == "uncertain":
        if judge_verdict == "irrelevant":
            return "uncertain", "model-alone-never-dismisses"
        return judge_verdict, "model-decides"
    if judge_verdict == "uncertain":
        return signal_verdict, "signals-decide"
    return "uncertain", "disagree"
