"""Operator screens of the quality loop: failed queries and bad cases (read-only: they change
through the API), replay and triage runs (read-only, with cancel and retry actions that call the
same services as the API), and the golden-question upload form (``…/goldenquestion/import/``),
which reads a CSV or JSONL file and calls the same bulk import as the API."""

from __future__ import annotations

from typing import Any, Protocol

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from knowledgefs.admin import ReadOnlyAdminMixin, ServiceActionMixin
from knowledgefs.auth.principal import Principal
from knowledgefs.errors import ServiceError
from spaces.models import KnowledgeSpace

from . import charts, replay, trends, triage_runs
from .evidence_match import bulk_import
from .golden_files import read_rows
from .models import BadCase, FailedQuery, ReplayRun, TriageRun


class GoldenImportForm(forms.Form):
    space = forms.ModelChoiceField(queryset=KnowledgeSpace.objects.order_by("tenant_id", "slug"))
    file = forms.FileField(help_text="CSV with a header row (question, evidence, tags, metadata) "
                           "or JSON Lines; at most 500 rows")  # fmt: skip
    match_policy = forms.ChoiceField(choices=[("all", "all"), ("any", "any")], initial="all")
    minimum_similarity = forms.FloatField(min_value=0, max_value=1, initial=0.7)


class GoldenImportMixin(admin.ModelAdmin):
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


class RunService(Protocol):
    """A run's service module (:mod:`.replay`, :mod:`.triage_runs`): what the actions call."""

    def cancel_run(self, run: Any, body: Any) -> Any: ...

    def retry_run(self, principal: Any, run: Any, body: Any) -> Any: ...


class RunActionsAdmin(ServiceActionMixin, admin.ModelAdmin):
    """Read-only durable runs with *cancel* and *retry* actions (change permission): each calls
    the run's service with the revision just read, as the API's compare-and-set; a refused run
    (already finished, still running, changed meanwhile) becomes a warning naming it."""

    actions = ["cancel_runs", "retry_runs"]
    service: RunService  # set by each run's admin
    kind = "run"

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a run is canceled (action), never deleted: it goes with its space

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
        }
        return super().change_view(request, object_id, form_url, extra_context)  # fmt: skip

    def _each(self, request, queryset, operation, verb: str) -> None:
        rows = ((run, f"{self.kind.capitalize()} run {run.id}") for run in queryset)
        done = self.apply_each(request, rows, operation)
        if done:
            self.message_user(request, f"{verb} {len(done)} {self.kind} run(s).", messages.SUCCESS)

    @admin.action(description="Cancel selected runs", permissions=["change"])
    def cancel_runs(self, request, queryset) -> None:
        cancel = self.service.cancel_run
        self._each(request, queryset, lambda r: cancel(r, {"expected_revision": r.revision}),
                   "Canceled")  # fmt: skip

    @admin.action(description="Retry selected runs", permissions=["change"])
    def retry_runs(self, request, queryset) -> None:
        self._each(request, queryset, self._retry, "Queued again")

    def _retry(self, run):
        return self.service.retry_run(
            self.retry_principal(run), run, {"expected_revision": run.revision}
        )

    def retry_principal(self, run):
        return None


@admin.register(TriageRun)
class TriageRunAdmin(RunActionsAdmin):
    """Triage runs of failed queries; a retry keeps the run's requester provenance (it labels
    only the rows that requester covers)."""

    service = triage_runs
    kind = "triage"
    list_display = ("id", "space", "state", "attempt", "row_limit", "triaged", "requester",
                    "created_at", "completed_at")  # fmt: skip
    list_filter = ("state",)
    list_select_related = ("space",)
    search_fields = ("=id", "=tenant_id", "space__slug")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in TriageRun._meta.fields]
    show_full_result_count = False

    @admin.display(description="triaged")
    def triaged(self, run) -> int:
        return (run.summary or {}).get("triaged", 0)


@admin.register(ReplayRun)
class ReplayRunAdmin(RunActionsAdmin):
    """Replay runs; a run's page lists its items with the evidence diff per question. A retry
    from here runs on a fresh snapshot as the tenant's operator."""

    service = replay
    kind = "replay"
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

    def retry_principal(self, run):
        return Principal(tenant_id=run.tenant_id)

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
