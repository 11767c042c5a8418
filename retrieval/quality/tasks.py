"""django-q2 entry points of replay and triage runs: they take ids and call the services."""

from __future__ import annotations

from . import replay_dispatch, replay_runner, triage_dispatch, triage_runs


def run_replay(run_pk: str, delivery: str) -> str:
    """Run the replay if ``delivery`` still claims it (a stale or repeated one changes nothing)."""
    return replay_runner.run_delivery(run_pk, delivery)


def sweep_replay_runs() -> dict[str, int]:
    """The recovery sweep (every minute: ``replay_dispatch.SWEEP``)."""
    return replay_dispatch.QUEUE.sweep().as_dict()


def run_triage(run_pk: str, delivery: str) -> str:
    """Run the triage if ``delivery`` still claims it (a stale or repeated one changes nothing)."""
    return triage_runs.run_delivery(run_pk, delivery)


def sweep_triage_runs() -> dict[str, int]:
    """The recovery sweep of triage runs (every minute: ``triage_dispatch.SWEEP``)."""
    return triage_dispatch.QUEUE.sweep().as_dict()
