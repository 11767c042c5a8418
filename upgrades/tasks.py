"""django-q2 task entry points of the upgrade bridge: they take ids and call the services (safe
to deliver twice: a stale or repeated claim or lease token is refused without a write).

The staged run (:mod:`upgrades.services.runner`, :mod:`upgrades.services.dispatch`) and document
reconciliation (:mod:`upgrades.services.reconciliation_runner`). Reconciliation's messages and
schedule row name these functions by their older dotted path
``upgrades.reconciliation_tasks.<name>`` (``TASK_FUNCTION``, ``RECOVERY_FUNCTION``, migration
``upgrades.0005``), which re-exports them.
"""

from __future__ import annotations

from upgrades.services import dispatch, reconciliation_runner, runner


def run_upgrade_step(job_id: str, task_id: str) -> str:
    """Run one step if ``task_id`` still claims the job (a stale or repeated delivery changes
    nothing); returns what happened (:func:`upgrades.services.runner.run_step`)."""
    return runner.run_step(job_id, task_id)


def sweep_upgrades() -> dict[str, int]:
    """The staged run's recovery sweep (every minute, schedule of migration ``upgrades.0006``)."""
    return dispatch.sweep().as_dict()


def reconcile_documents(job_id: str, lease_token: str) -> dict:
    """One delivery of a job's reconciliation lease; returns the outcome as a dict."""
    return reconciliation_runner.run_delivery(job_id, lease_token).as_dict()


def recover_reconciliations() -> dict:
    """The recovery tick (scheduled every minute by migration ``upgrades.0005``)."""
    return reconciliation_runner.recover_reconciliations().as_dict()
