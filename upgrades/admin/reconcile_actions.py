"""Admin pieces of document reconciliation, for the upgrade-job and upgrade-document admins.

Wire them in ``upgrades/admin/jobs.py``::

    from .reconcile_actions import reconciliation_state, rearm_dead_lettered_reconciliation

    class UpgradeJobAdmin(admin.ModelAdmin):
        actions = [..., rearm_dead_lettered_reconciliation]
        list_display = [..., reconciliation_state]
        readonly_fields = [..., "reconcile_lease_token", "reconcile_lease_expires_at",
                           "reconcile_dispatched_at", "reconcile_attempt_count",
                           "reconcile_completed_at", "reconcile_dead_lettered_at"]

The document admin shows ``state_reconcile_attempt_count``, ``state_reconcile_error``,
``state_reconciled_at`` and ``state_dead_lettered_at`` read-only and can list_filter on
``state_dead_lettered_at`` (``admin.EmptyFieldListFilter``).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from upgrades.services import reconciliation_ledger


@admin.action(description="Re-arm dead-lettered reconciliation", permissions=["change"])
def rearm_dead_lettered_reconciliation(modeladmin, request, queryset):
    """Clear the dead letter of the selected upgrade jobs and their documents (fresh attempts);
    the recovery schedule re-issues their leases within a minute."""
    total = 0
    jobs = 0
    for job_id in queryset.values_list("id", flat=True):
        count = reconciliation_ledger.rearm_dead_lettered(job_id)
        total += count
        jobs += 1 if count else 0
    modeladmin.message_user(
        request,
        f"Re-armed {total} dead-lettered documents in {jobs} jobs; recovery re-issues them "
        "within a minute.",
        messages.SUCCESS if total else messages.INFO,
    )


@admin.display(description="Reconciliation")
def reconciliation_state(job) -> str:
    """One word for the job's reconciliation: ``none`` (not succeeded), ``done``,
    ``dead-lettered``, ``leased`` (a live delivery) or ``owed`` (waiting for recovery)."""
    if job.status != "succeeded":
        return "none"
    if job.reconcile_completed_at:
        return "done"
    if job.reconcile_dead_lettered_at:
        return "dead-lettered"
    if job.reconcile_lease_token and job.reconcile_lease_expires_at > timezone.now():
        return "leased"
    return "owed"
