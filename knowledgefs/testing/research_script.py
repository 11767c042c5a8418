"""The scripted reasoning model the Research tests share: one planner answer, one evidence
judgement asking for a supplemental round, one supplemental query, and the system-prompt
prefixes by which the Dify test server's ``llm_responder`` tells Research's steps apart."""

from __future__ import annotations

REASONER = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
QUESTION = "What should I know about annual leave and business travel?"
PLAN = {
    "intent": "leave allowance and travel rules",
    "sub_queries": ["annual leave days per year", "travel receipts deadline"],
    "evidence_dimensions": ["leave allowance", "receipt deadline", "train booking"],
}
JUDGEMENT = {
    "covered_dimensions": ["leave allowance", "receipt deadline"],
    "missing_dimensions": ["train booking"],
    "needs_supplemental": True,
}
SUPPLEMENT = {"query": "book trains for trips under four hours"}
STEPS = {
    "You plan searches": "planner",
    "You judge whether": "judge",
    "You write one search query": "supplemental",
    "You route a question": "route",
}


def step_of(system_prompt: str) -> str | None:
    """The Research step a request's system prompt belongs to (``None``: not Research's)."""
    return next((s for prefix, s in STEPS.items() if system_prompt.startswith(prefix)), None)
