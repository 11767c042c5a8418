"""Research's model prompts (planner, judge, supplemental planning), the plan they yield and
the check of the judge's labels."""

from __future__ import annotations

from dataclasses import dataclass

from .. import reasoning


@dataclass
class _Plan:
    path: str
    intent: str | None
    sub_queries: list[str]
    dimensions: list[str]


def _planner_prompt(query: str) -> reasoning.Prompt:
    system = reasoning.system_prompt(
        "You plan searches over a knowledge base for the question below. Name its intent, "
        "list up to 3 sub-queries only when the question has distinct parts (an empty list "
        "when it is simple), and list the evidence dimensions a complete answer needs.",
        reasoning.PLAN,
    )
    return reasoning.Prompt(system, f"Question:\n{query}", reasoning.PLAN)


def _judge_prompt(query: str, plan: _Plan, texts: list[str]) -> reasoning.Prompt:
    block = reasoning.untrusted_block(texts)
    system = reasoning.system_prompt(
        "You judge whether retrieved evidence covers a question. For each evidence dimension "
        "listed (copy the labels exactly; use no other label), say whether the evidence "
        "supports it, and whether one more search would likely find what is missing.",
        reasoning.JUDGE,
    )
    labels = "\n".join(f"- {d}" for d in plan.dimensions)
    user = f"Question:\n{query}\n\nEvidence dimensions:\n{labels}\n\nEvidence:\n{block.text}"
    return reasoning.Prompt(system, user, reasoning.JUDGE)


def _checked_judgement(output: dict, dimensions: list[str]) -> dict | None:
    """The judge may only name the planner's own dimension labels (case ignored); anything
    else is invalid output. Returns the judgement with the planner's spelling."""
    known = {d.casefold(): d for d in dimensions}
    checked = {}
    for key in ("covered_dimensions", "missing_dimensions"):
        labels = [known.get(d.casefold()) for d in output[key]]
        if None in labels:
            return None
        checked[key] = labels
    return {**checked, "needs_supplemental": output["needs_supplemental"]}


def _supplemental_prompt(query: str, missing: list[str]) -> reasoning.Prompt:
    system = reasoning.system_prompt(
        "You write one search query over a knowledge base that would find the facts a "
        "question still lacks. Use the question and the missing fact labels only.",
        reasoning.SUPPLEMENT,
    )
    labels = "\n".join(f"- {d}" for d in missing)
    return reasoning.Prompt(
        system, f"Question:\n{query}\n\nMissing facts:\n{labels}", reasoning.SUPPLEMENT
    )
