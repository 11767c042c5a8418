"""Progress of a compilation job: the percent reached at each checkpoint and the progress dict.

``progress`` on a job row is ``{"phase", "operation", "percent", **counters}`` (counters such as
``nodes_total`` and ``nodes_embedded``); ``progress_percent`` mirrors ``percent``.
"""

from __future__ import annotations

from ingestion.models import Stage

# Percent of the whole job reached at each checkpoint; embedding fills 50 → 90.
PROGRESS: dict[str, int] = {
    Stage.QUEUED: 0,
    Stage.PARSED: 30,
    Stage.NODES_GENERATED: 50,
    Stage.PROJECTION_BUILT: 95,
    Stage.PUBLISHED: 100,
}


# Embedding progress is written at most this often; leases are re-read after every batch.
PROGRESS_WRITE_SECONDS = 1.0


def _progress(phase: str, operation: str, percent: int, **counters) -> dict:
    return {"phase": phase, "operation": operation, "percent": int(percent), **counters}
