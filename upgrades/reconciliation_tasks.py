"""django-q2 entry points of document reconciliation: they take ids and call
:mod:`upgrades.services.reconciliation` (safe to deliver twice: a stale or repeated token is
rejected without a write)."""

from __future__ import annotations

from upgrades.services import reconciliation


def reconcile_documents(job_id: str, lease_token: str) -> dict:
    """One delivery of a job's reconciliation lease; returns the outcome as a dict."""
    return reconciliation.run_delivery(job_id, lease_token).as_dict()


def recover_reconciliations() -> dict:
    """The recovery tick (scheduled every minute by migration ``upgrades.0005``)."""
    return reconciliation.recover_reconciliations().as_dict()
