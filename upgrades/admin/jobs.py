"""Admin for upgrade jobs, their documents and file leases.

Read-only screens: every change goes through the services (the action "Retry failed upgrades"
calls :func:`upgrades.services.snapshot.retry_upgrade`). Jobs cannot be added or deleted here.
A stuck job reads as: its status and stage, the claim (``task_id``, claimed at, step started
at), attempts of the current step, the countdown (``next_step_at``), the last error, and per
document its checkpoint.
"""

from __future__ import annotations

from django.contrib import admin, messages

from knowledgefs.errors import ServiceError
from upgrades.models import UpgradeDocument, UpgradeFileLease, UpgradeJob
from upgrades.services import snapshot

from .reconcile_actions import rearm_dead_lettered_reconciliation, reconciliation_state


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class UpgradeDocumentInline(ReadOnlyInline):
    model = UpgradeDocument
    fields = (
        "legacy_document_id",
        "name",
        "status",
        "document",
        "compilation_job_id",
        "last_error_code",
        "last_error_message",
        "desired_enabled",
        "state_reconcile_attempt_count",
        "state_reconciled_at",
        "state_dead_lettered_at",
        "state_reconcile_error",
    )
    readonly_fields = fields
    raw_id_fields = ("document",)
    ordering = ("id",)


class UpgradeFileLeaseInline(ReadOnlyInline):
    model = UpgradeFileLease
    fields = (
        "upload_file_id",
        "status",
        "expires_at",
        "released_at",
        "cleanup_requested_at",
    )
    readonly_fields = fields


@admin.register(UpgradeJob)
class UpgradeJobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "tenant_id",
        "dataset_id",
        "status",
        "stage",
        "counts",
        "attempt_count",
        "task_id",
        "claimed_at",
        "reconcile_lease_expires_at",
        reconciliation_state,
        "last_error_code",
        "updated_at",
    )
    list_filter = ("status", "stage")
    search_fields = ("=id", "=tenant_id", "=dataset_id", "=idempotency_key")
    readonly_fields = [f.name for f in UpgradeJob._meta.fields]
    inlines = [UpgradeDocumentInline, UpgradeFileLeaseInline]
    actions = ["retry_failed_upgrades", rearm_dead_lettered_reconciliation]
    show_full_result_count = False
    ordering = ("-created_at",)

    @admin.display(description="documents (done/failed/total)")
    def counts(self, job: UpgradeJob) -> str:
        return f"{job.completed_documents}/{job.failed_documents}/{job.total_documents}"

    def has_add_permission(self, request) -> bool:
        return False  # jobs come from Dify's snapshot route

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the job is the upgrade's record

    def has_change_permission(self, request, obj=None) -> bool:
        # The change page is a read-only view; the retry action needs "change".
        return obj is None and super().has_change_permission(request, obj)

    @admin.action(description="Retry failed upgrades", permissions=["change"])
    def retry_failed_upgrades(self, request, queryset) -> None:
        retried = 0
        for job_id, status in queryset.values_list("id", "status"):
            try:
                _, done = snapshot.retry_upgrade(job_id)
            except ServiceError as exc:
                self.message_user(request, f"Upgrade {job_id}: {exc.message}", messages.WARNING)
                continue
            if done:
                retried += 1
            else:
                self.message_user(
                    request, f"Upgrade {job_id} is {status}: left unchanged", messages.INFO
                )
        if retried:
            self.message_user(
                request,
                f"Queued {retried} upgrade{'s' if retried != 1 else ''} again.",
                messages.SUCCESS,
            )
