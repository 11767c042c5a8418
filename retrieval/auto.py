"""Auto mode: an explicit ``mode: "auto"`` picks one concrete mode for a request.

:func:`resolve_mode` asks the space's reasoning model once (:func:`retrieval.reasoning.ask`,
no tools, the answer strictly ``{"mode": "fast"|"deep"|"research"}``) for the least expensive
mode that can answer the question. Without a reasoning model, or on any failure (timeout,
provider error, invalid output), it falls back to the space's default mode (``fast`` when that
default is itself ``auto``). No language, length or keyword heuristics: the model decides or
the default applies. The choice is recorded in the route (``RetrievalResult.route``).
"""

from __future__ import annotations

from typing import Any

from . import reasoning

CHOICES = ("fast", "deep", "research")
ROUTE = reasoning.Schema(
    "route",
    (
        reasoning.Field(
            "mode", "enum", "the least expensive mode that can answer the question", choices=CHOICES
        ),
    ),
)


def fallback_mode(profile) -> str:
    """The profile's default mode, or ``fast`` when the default is ``auto``."""
    default = profile.retrieval_default_mode
    return default if default in CHOICES else "fast"


def route_prompt(query: str) -> reasoning.Prompt:
    """The routing prompt: the question and the three modes, nothing else."""
    system = reasoning.system_prompt(
        "You route a question to the least expensive retrieval mode that can answer it:\n"
        '- "fast": one hybrid search; for a direct lookup of one fact or passage;\n'
        '- "deep": a wider search with the surrounding sections of each hit; for questions '
        "needing context around the answer;\n"
        '- "research": several searches planned from the question, fused and judged; for '
        "questions with several parts, comparisons, or evidence spread over documents.",
        ROUTE,
    )
    return reasoning.Prompt(system, f"Question:\n{query}", ROUTE)


def resolve_mode(space, profile, query: str) -> tuple[str, dict]:
    """Return ``(concrete_mode, route)``; ``route`` is ``{requested_mode: "auto",
    resolved_mode, resolver: "llm"|"fallback", degraded: bool, error: str|None,
    prompt_version, duration_ms}``.

    ``error`` is a safe error class: ``no_reasoning_model`` (not degraded: nothing failed),
    ``reasoning_timeout``, ``reasoning_provider_error``, ``reasoning_invalid_output``
    (degraded). Never raises for a model failure: the fallback is the profile's default mode.
    """
    selection = reasoning.reasoning_selection(profile)
    route: dict[str, Any] = {
        "requested_mode": "auto",
        "resolved_mode": fallback_mode(profile),
        "resolver": "fallback",
        "degraded": False,
        "error": "no_reasoning_model",
        "prompt_version": reasoning.PROMPT_VERSION,
        "duration_ms": 0.0,
    }
    if selection is None:
        return route["resolved_mode"], route
    try:
        answer = reasoning.ask(space, selection, route_prompt(query))
    except reasoning.ReasoningError as exc:
        route.update(degraded=True, error=exc.code)
        return route["resolved_mode"], route
    route.update(
        resolved_mode=answer.output["mode"],
        resolver="llm",
        error=None,
        duration_ms=answer.duration_ms,
    )
    return answer.output["mode"], route
