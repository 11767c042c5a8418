"""Operator screen for dense index versions (read-only: changes go through the API or kfs)."""

from __future__ import annotations

from django.contrib import admin

from .models import AnswerTrace, IndexVersion


@admin.register(IndexVersion)
class IndexVersionAdmin(admin.ModelAdmin):
    list_display = (
        "space",
        "number",
        "model_id",
        "dimension",
        "state",
        "created_at",
        "activated_at",
    )
    list_filter = ("state", "model_id")
    list_select_related = ("space",)
    search_fields = ("=id", "space__slug", "model_id")
    readonly_fields = [f.name for f in IndexVersion._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AnswerTrace)
class AnswerTraceAdmin(admin.ModelAdmin):
    """Answer runs, newest first (read-only: traces are written by the answer service only)."""

    list_display = (
        "id",
        "space",
        "source",
        "mode",
        "answerability",
        "finish_reason",
        "error_code",
        "completed",
        "created_at",
    )
    list_filter = ("source", "mode", "answerability", "completed")
    list_select_related = ("space",)
    search_fields = ("=id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in AnswerTrace._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


from retrieval.research_tasks import admin as _research_task_admin  # noqa: E402, F401
