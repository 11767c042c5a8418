"""Operator screens of the quality loop: failed queries and bad cases (read-only: they change
through the API), and the golden-question upload form (``…/goldenquestion/import/``), which
reads a CSV or JSONL file and calls the same bulk import as the API."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from knowledgefs.admin import ReadOnlyAdminMixin
from knowledgefs.errors import ServiceError
from spaces.models import KnowledgeSpace

from .evidence_match import bulk_import
from .golden_files import read_rows
from .models import BadCase, FailedQuery


class GoldenImportForm(forms.Form):
    space = forms.ModelChoiceField(queryset=KnowledgeSpace.objects.order_by("tenant_id", "slug"))
    file = forms.FileField(help_text="CSV with a header row (question, evidence, tags, metadata) "
                           "or JSON Lines; at most 500 rows")  # fmt: skip
    match_policy = forms.ChoiceField(choices=[("all", "all"), ("any", "any")], initial="all")
    minimum_similarity = forms.FloatField(min_value=0, max_value=1, initial=0.7)


class GoldenImportMixin:
    """The ``import/`` page of the golden-question admin (add permission)."""

    def get_urls(self):
        return [
            path(
                "import/",
                self.admin_site.admin_view(self.import_view),
                name="retrieval_goldenquestion_import",
            ),
            *super().get_urls(),
        ]

    def import_view(self, request):
        if not self.has_add_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        form = GoldenImportForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            try:
                rows = read_rows(getattr(upload, "raw_name", upload.name), upload.read())
                result = bulk_import(
                    form.cleaned_data["space"],
                    {
                        "rows": rows,
                        "match_policy": form.cleaned_data["match_policy"],
                        "minimum_similarity": form.cleaned_data["minimum_similarity"],
                    },
                )
            except ServiceError as exc:
                form.add_error("file", f"{exc.code}: {exc.message}")
            else:
                messages.success(
                    request,
                    f"Imported {len(result['items'])} golden questions: "
                    f"{result['active_count']} active, {result['draft_count']} draft.",
                )
                return HttpResponseRedirect(reverse("admin:retrieval_goldenquestion_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Import golden questions",
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retrieval/goldenquestion/import.html", context)


@admin.register(FailedQuery)
class FailedQueryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "space", "trigger", "status", "verdict", "requester_kind", "created_at")
    list_filter = ("trigger", "status", "verdict")
    list_select_related = ("space",)
    search_fields = ("=id", "=trace_id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in FailedQuery._meta.fields]
    show_full_result_count = False


@admin.register(BadCase)
class BadCaseAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "space", "status", "revision", "requester", "created_at")
    list_filter = ("status",)
    list_select_related = ("space",)
    search_fields = ("=id", "=trace_id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in BadCase._meta.fields]
    show_full_result_count = False
