"""Operator screens: dense index versions (read-only: changes go through the API or kfs) and
golden questions (editable; every change goes through :mod:`retrieval.golden`'s validation)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from knowledgefs.admin import ReadOnlyAdminMixin
from knowledgefs.errors import InvalidInput

from . import golden
from .models import AnswerTrace, GoldenQuestion, IndexVersion
from .quality.admin import GoldenImportMixin


@admin.register(IndexVersion)
class IndexVersionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
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


@admin.register(AnswerTrace)
class AnswerTraceAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
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


class GoldenQuestionForm(forms.ModelForm):
    """Validates each member with the API's rules (limits and codes of :mod:`retrieval.golden`)."""

    # Left out (as through the API): active, all.
    status = forms.ChoiceField(
        choices=[(s, s) for s in golden.STATUSES], initial="active", required=False
    )
    match_policy = forms.ChoiceField(
        choices=[(p, p) for p in golden.MATCH_POLICIES], initial="all", required=False
    )

    class Meta:
        model = GoldenQuestion
        fields = ("space", "question", "expected_evidence", "tags", "metadata", "status",
                  "match_policy")  # fmt: skip

    def clean(self):
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean() returns
        space = data.get("space") or getattr(self.instance, "space", None)

        def evidence(value):
            assert space is not None  # the loop below skips the evidence without a space
            return golden.validate_evidence(space, value)

        checks = {
            "question": golden.validate_question,
            "expected_evidence": evidence,
            "tags": golden.validate_tags,
            "metadata": golden.validate_metadata,
            "status": golden.validate_status,
            "match_policy": golden.validate_match_policy,
        }
        for name, check in checks.items():
            if name not in data or (name == "expected_evidence" and space is None):
                continue
            if name in ("status", "match_policy") and not data[name]:
                data[name] = None  # the default
            try:
                data[name] = check(data[name])
            except InvalidInput as exc:
                self.add_error(name, ValidationError(f"{exc.code}: {exc.message}"))
        return data


@admin.register(GoldenQuestion)
class GoldenQuestionAdmin(GoldenImportMixin, admin.ModelAdmin):
    """Golden questions per space; ``tenant_id`` follows the space and ``revision`` moves on by
    one per save, as through the API."""

    form = GoldenQuestionForm
    list_display = (
        "short_question",
        "space",
        "tenant_id",
        "status",
        "tags",
        "revision",
        "updated_at",
    )
    list_select_related = ("space",)
    list_filter = ("status", "tenant_id")
    search_fields = ("=id", "question", "space__slug")
    readonly_fields = ("id", "tenant_id", "revision", "created_at", "updated_at")
    raw_id_fields = ("space",)
    show_full_result_count = False

    @admin.display(description="question")
    def short_question(self, obj) -> str:
        return obj.question if len(obj.question) <= 80 else obj.question[:79] + "…"

    def get_readonly_fields(self, request, obj=None):
        return (*self.readonly_fields, "space") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change) -> None:
        obj.tenant_id = obj.space.tenant_id
        if change:
            obj.revision += 1
        super().save_model(request, obj, form, change)


from retrieval.research_tasks import admin as _research_task_admin  # noqa: E402, F401
