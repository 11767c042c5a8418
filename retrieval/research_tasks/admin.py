"""Operator screen for research tasks: read-only, with cancel and resume actions (change
permission) that call the same services as the API."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html

from knowledgefs.admin import ServiceActionMixin

from . import service
from .models import ResearchTask


@admin.register(ResearchTask)
class ResearchTaskAdmin(ServiceActionMixin, admin.ModelAdmin):
    list_display = (
        "short_query",
        "space",
        "tenant_id",
        "stage",
        "run_state",
        "attempt_count",
        "error_column",
        "duration",
        "created_at",
    )
    list_filter = ("run_state", "stage")
    list_select_related = ("space",)
    search_fields = ("=id", "=tenant_id", "=task_id", "query")
    ordering = ("-created_at",)
    actions = ["cancel_tasks", "resume_tasks"]
    readonly_fields = [f.name for f in ResearchTask._meta.fields]
    fieldsets = [
        (None, {"fields": ["id", "space", "tenant_id", "query", "top_k", "filters", "limits"]}),
        ("Progress", {"fields": ["stage", "run_state", "checkpoint", "elapsed_ms"]}),
        ("Result", {"fields": ["result", "plan"]}),
        ("Error", {"fields": ["error_code", "error_message"]}),
        (
            "Execution",
            {
                "fields": [
                    "task_id",
                    "claimed_at",
                    "step_started_at",
                    "heartbeat_at",
                    "attempt_count",
                    "resume_count",
                ]
            },
        ),
        (
            "Provenance",
            {
                "fields": [
                    "owner",
                    "api_key_id",
                    "subject",
                    "caller_kind",
                    "idempotency_key",
                    "request_fingerprint",
                ]
            },
        ),
        ("Times", {"fields": ["created_at", "started_at", "finished_at", "updated_at"]}),
    ]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a task is canceled (action), never deleted: it goes with its space

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Every field is read-only: offer no Save buttons that would save nothing.
        extra_context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
        }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="query", ordering="query")
    def short_query(self, task: ResearchTask) -> str:
        return task.query if len(task.query) <= 60 else task.query[:59] + "…"

    @admin.display(description="error", ordering="error_code")
    def error_column(self, task: ResearchTask) -> str:
        if not task.error_code:
            return ""
        return format_html('<span title="{}">{}</span>', task.error_message, task.error_code)

    @admin.display(description="run time", ordering="elapsed_ms")
    def duration(self, task: ResearchTask) -> str:
        return f"{task.elapsed_ms / 1000:.1f} s" if task.elapsed_ms else "–"

    @admin.action(description="Cancel selected research tasks", permissions=["change"])
    def cancel_tasks(self, request, queryset) -> None:
        done = self._each(request, queryset, service.cancel_task)
        if done:
            self.message_user(request, f"Canceled {_tasks(done)}.", messages.SUCCESS)

    @admin.action(description="Resume selected research tasks", permissions=["change"])
    def resume_tasks(self, request, queryset) -> None:
        done = self._each(request, queryset, service.resume_task)
        if done:
            self.message_user(request, f"Queued {_tasks(done)} again.", messages.SUCCESS)

    def _each(self, request, queryset, operation) -> int:
        """Apply ``operation(task_id)`` to every selected task; warn about each one refused."""
        rows = queryset.values_list("id", flat=True)
        return len(self.apply_each(request, ((t, f"Task {t}") for t in rows), operation))


def _tasks(count: int) -> str:
    return f"{count} research task{'' if count == 1 else 's'}"
