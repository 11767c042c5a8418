"""Operator screens of the quality loop: failed queries and bad cases (read-only: they change
through the API), and the golden-question upload form (``…/goldenquestion/import/``), which
reads a CSV or JSONL file and calls the same bulk import as the API."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from knowledgefs.admin import ReadOnlyAdminMixin
from knowledgefs.auth.principal import Principal
from knowledgefs.errors import ServiceError
from spaces.models import KnowledgeSpace

from . import charts, trends
from .evidence_match import bulk_import
from .golden_files import read_rows
from .models import BadCase, FailedQuery, ReplayRun


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
    """Failed queries, and the quality page of a space (``space/<space_id>/``): trends and
    charts, as an operator of the space's tenant sees them."""

    list_display = (
        "id", "space", "trigger", "status", "verdict", "requester_kind", "created_at",
        "quality_page",
    )  # fmt: skip
    list_filter = ("trigger", "status", "verdict")
    list_select_related = ("space",)
    search_fields = ("=id", "=trace_id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in FailedQuery._meta.fields]
    show_full_result_count = False

    @admin.display(description="quality")
    def quality_page(self, row) -> str:
        url = reverse("admin:retrieval_quality_space", args=[row.space_id])
        return format_html('<a href="{}">charts</a>', url)

    def get_urls(self):
        return [
            path(
                "space/<uuid:space_id>/",
                self.admin_site.admin_view(self.quality_view),
                name="retrieval_quality_space",
            ),
            *super().get_urls(),
        ]

    def quality_view(self, request, space_id):
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        space = get_object_or_404(KnowledgeSpace, id=space_id)
        operator = Principal(tenant_id=space.tenant_id)
        params = {"window": request.GET.get("window") or "7d"}
        if params["window"] not in trends.WINDOWS:
            params["window"] = "7d"
        data = trends.trends(operator, space, params)
        rate, base = data["current"]["pass_rate"], data["baseline"]["pass_rate"]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Quality of {space.name}",
            "opts": self.model._meta,
            "trends": data,
            "windows": list(trends.WINDOWS),
            "pass_rate_percent": round(rate * 100, 1) if rate is not None else None,
            "baseline_percent": round(base * 100, 1) if base is not None else None,
            "pass_rate_chart": charts.pass_rate_chart(data["daily"]),
            "failed_chart": charts.failed_queries_chart(data["daily"]),
            "unanswered_chart": charts.unanswered_chart(data["top_unanswered"]),
            "runs": ReplayRun.objects.filter(space=space).order_by("-created_at")[:20],
        }
        return TemplateResponse(request, "admin/retrieval/quality_space.html", context)


@admin.register(BadCase)
class BadCaseAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "space", "status", "revision", "requester", "created_at")
    list_filter = ("status",)
    list_select_related = ("space",)
    search_fields = ("=id", "=trace_id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in BadCase._meta.fields]
    show_full_result_count = False


@admin.register(ReplayRun)
class ReplayRunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Replay runs; a run's page lists its items with the evidence diff per question."""

    list_display = ("id", "space", "state", "mode", "attempt", "created_at", "completed_at")
    list_filter = ("state", "mode")
    list_select_related = ("space",)
    search_fields = ("=id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    fields = ("id", "space", "state", "mode", "attempt", "error_code", "error_message",
              "summary", "frozen_snapshot", "created_at", "completed_at",
              "evidence_diff")  # fmt: skip
    readonly_fields = fields
    show_full_result_count = False

    @admin.display(description="items: evidence diff per question")
    def evidence_diff(self, run) -> str:
        rows = []
        for item in run.items.order_by("ordinal"):
            diff = (item.result or {}).get("evidence_diff") or {}
            missing = [e.get("text") or e.get("document_id") or e.get("node_id")
                       for e in diff.get("evidence_items", []) if not e.get("matched")]  # fmt: skip
            retrieved = ", ".join(r.get("filename") or "" for r in diff.get("retrieved", [])[:5])
            rows.append((item.ordinal, item.state, item.question, diff.get("matched_count", "—"),
                         diff.get("expected_count", "—"), "; ".join(map(str, missing)) or "—",
                         retrieved or "—"))  # fmt: skip
        body = format_html_join(
            "", '<tr class="kfs-item kfs-{}"><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td>'
            "<td>{}</td><td>{}</td></tr>",
            ((r[1], r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows),
        )  # fmt: skip
        return format_html(
            '<table id="kfs-evidence-diff"><thead><tr><th>#</th><th>state</th><th>question</th>'
            "<th>matched</th><th>missing evidence</th><th>retrieved</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            body,
        )
