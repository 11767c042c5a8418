"""Research mode (contract; implemented by the Research slice).

:func:`run_research` is the one entry point for both interactive requests (``retrieve(...,
mode="research")``: ≤ 3 model calls, 60 s) and durable research tasks (≤ 3 model calls plus at
most one supplemental round, 180 s). Durable callers pass ``checkpoint`` (a JSON-serialisable
dict the function fills with each finished model call's validated output, keyed by step name)
and ``save_checkpoint`` (called after every step with the updated dict; the task persists it);
a resumed run given the saved ``checkpoint`` repeats no finished model call. ``should_stop`` is
polled between steps; when it returns ``True`` the run raises :class:`ResearchCanceled`.
"""

from __future__ import annotations

from collections.abc import Callable


class ResearchCanceled(Exception):
    """Raised between steps when ``should_stop()`` answered ``True``."""


def run_research(
    space,
    query: str,
    *,
    top_k: int,
    score_threshold: float | None,
    filters=None,
    durable: bool = False,
    checkpoint: dict | None = None,
    save_checkpoint: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
):
    """Return a :class:`retrieval.services.RetrievalResult` with ``mode="research"``.

    ``result.metrics`` carries ``research_model_calls``, ``research_rounds``,
    ``research_supplemental_searches``, ``research_path`` (``"reasoning"`` or
    ``"deterministic"``), ``budget_exhausted`` (reason or ``None``).
    """
    raise NotImplementedError("Research mode is built by the Research slice")
