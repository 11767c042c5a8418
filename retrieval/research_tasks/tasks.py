"""django-q2 entry points of research tasks: they take ids and call the services."""

from __future__ import annotations

from . import dispatch, runner


def run_research_task(task_pk: str, delivery: str) -> str:
    """Run the task if ``delivery`` still claims it (a stale or repeated delivery changes
    nothing); returns what happened (:func:`retrieval.research_tasks.runner.run_delivery`)."""
    return runner.run_delivery(task_pk, delivery)


def sweep_research_tasks() -> dict[str, int]:
    """The recovery sweep (every minute, schedule of migration ``retrieval.0006``)."""
    return dispatch.sweep().as_dict()
