"""Auto mode: an explicit ``mode: "auto"`` picks one concrete mode for a request.

Contract (owned by the Auto/Research slice): :func:`resolve_mode` asks the space's reasoning model
for exactly one concrete mode; without a reasoning model, or on any failure (timeout, provider
error, invalid output), it falls back to the space's default mode. The choice is recorded.
"""

from __future__ import annotations


def resolve_mode(space, profile, query: str) -> tuple[str, dict]:
    """Return ``(concrete_mode, route)``; ``route`` is ``{requested_mode: "auto",
    resolved_mode, resolver: "llm"|"fallback", degraded: bool, error: str|None}``.

    Never raises for a model failure: the fallback is the profile's default mode.
    """
    default = profile.retrieval_default_mode
    return default, {
        "requested_mode": "auto",
        "resolved_mode": default,
        "resolver": "fallback",
        "degraded": False,
        "error": "no_reasoning_model",
    }
