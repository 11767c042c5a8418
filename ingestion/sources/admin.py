"""The admin of sources and source runs: read-only rows, with the actions operators have for
compilation jobs (cancel, retry) calling the same services as the API
(:mod:`ingestion.sources.runs`), one run at a time, every refusal reported."""

from __future__ import annotations

from django.contrib import admin, messages

from knowledgefs.admin import ServiceActionMixin

from . import runs
from .models import Source, SourceItem, SourceRun


class SourceItemInline(admin.TabularInline):
    model = SourceItem
    fields = ("name", "provider_item_id", "state", "document", "sha256", "disabled_at")
    readonly_fields = fields
    extra = 0
    max_num = 0
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = (
        "name", "kind", "provider", "space", "tenant_id", "sync_mode", "sync_enabled",
        "next_run_at", "last_synced_at",
    )  # fmt: skip
    list_filter = ("kind", "sync_mode", "sync_enabled")
    search_fields = ("=id", "name", "provider", "tenant_id")
    readonly_fields = [f.name for f in Source._meta.fields]
    inlines = [SourceItemInline]
    ordering = ("-created_at",)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(SourceRun)
class SourceRunAdmin(ServiceActionMixin, admin.ModelAdmin):
    list_display = (
        "id", "source", "kind", "trigger", "state", "checkpoint", "progress", "error_code",
        "attempt_count", "created_at", "updated_at",
    )  # fmt: skip
    list_filter = ("state", "kind", "trigger")
    list_select_related = ("source",)
    search_fields = ("=id", "source__name", "=task_id")
    readonly_fields = [f.name for f in SourceRun._meta.fields]
    actions = ["retry_runs", "cancel_runs"]
    ordering = ("-created_at",)
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="progress")
    def progress(self, run: SourceRun) -> str:
        total = "?" if run.progress_total is None else run.progress_total
        return (
            f"{run.progress_completed} done, {run.progress_skipped} skipped, "
            f"{run.progress_failed} failed of {total}"
        )

    @admin.action(description="Retry selected source runs", permissions=["change"])
    def retry_runs(self, request, queryset) -> None:
        done = self._each(request, queryset, runs.retry_run)
        if done:
            self.message_user(request, f"Queued {done} run(s) again.", messages.SUCCESS)

    @admin.action(description="Cancel selected source runs", permissions=["change"])
    def cancel_runs(self, request, queryset) -> None:
        done = self._each(request, queryset, runs.cancel_run)
        if done:
            self.message_user(request, f"Canceled {done} run(s).", messages.SUCCESS)

    def _each(self, request, queryset, operation) -> int:
        rows = [
            (run, f"Run {run.id} ({run.source.name if run.source else run.kind})")
            for run in queryset
        ]
        return len(self.apply_each(request, rows, operation))
