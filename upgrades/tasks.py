"""django-q2 task entry points of the staged run: they take ids and call the services."""

from __future__ import annotations

from upgrades.services import dispatch, runner


def run_upgrade_step(job_id: str, task_id: str) -> str:
    """Run one step if ``task_id`` still claims the job (a stale or repeated delivery changes
    nothing); returns what happened (:func:`upgrades.services.runner.run_step`)."""
    return runner.run_step(job_id, task_id)


def sweep_upgrades() -> dict[str, int]:
    """The staged run's recovery sweep (every minute, schedule of migration ``upgrades.0006``)."""
    return dispatch.sweep().as_dict()
