"""django-q2 entry points of replay runs: they take ids and call the services."""

from __future__ import annotations

from . import replay_dispatch, replay_runner


def run_replay(run_pk: str, delivery: str) -> str:
    """Run the replay if ``delivery`` still claims it (a stale or repeated one changes nothing)."""
    return replay_runner.run_delivery(run_pk, delivery)


def sweep_replay_runs() -> dict[str, int]:
    """The recovery sweep (every minute: ``replay_dispatch.SWEEP``)."""
    return replay_dispatch.sweep().as_dict()
