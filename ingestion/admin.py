from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages

# (a private Django helper the stubs do not declare: the admin's own yes/no icon)
from django.contrib.admin.templatetags.admin_list import _boolean_icon  # type: ignore[attr-defined]
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince
from django.utils.timezone import localtime

from knowledgefs.admin import ServiceActionMixin
from spaces.models import KnowledgeSpace

from .compilation import operations
from .documents import purge_documents
from .models import CompilationJob, Document, KnowledgeNode, ParseArtifact, RunState

# The source and source-run admins register themselves (ingestion/sources/admin.py).
from .sources.admin import SourceAdmin as SourceAdmin
from .sources.admin import SourceRunAdmin as SourceRunAdmin


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = (
        "filename_column",
        "space",
        "state",
        "error_code",
        "node_count",
        "size_bytes",
        "created_at",
    )
    list_filter = ("state", "mime_type")
    list_select_related = ("space",)
    search_fields = ("filename", "sha256", "=id")
    raw_id_fields = ("space",)
    readonly_fields = [f.name for f in Document._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False  # documents are uploaded through the API or kfs ingest

    @admin.display(description="filename", ordering="filename")
    def filename_column(self, document: Document) -> str:
        return ellipsized(document.filename)

    # Deleting goes through the service, like the API: live jobs canceled, nodes out of every
    # index, stored bytes removed, the publication head moved.
    def delete_model(self, request, obj) -> None:
        purge_documents(Document.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset) -> None:
        purge_documents(queryset)

    def get_deleted_objects(self, objs, request):
        # Jobs and nodes cannot be deleted on their own, but the purge removes them with their
        # document: the permission to delete the document is enough.
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected


class TenantFilter(admin.SimpleListFilter):
    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request, model_admin):
        # Tenants are read from the spaces table: a job's tenant is its space's, and a DISTINCT
        # over the (much larger, tenant-unindexed) jobs table would scan it on every page load.
        tenants = (
            KnowledgeSpace.objects.order_by("tenant_id")
            .values_list("tenant_id", flat=True)
            .distinct()
        )
        return [(tenant, tenant) for tenant in tenants]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(tenant_id=self.value())
        return queryset


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [
            ("lt1h", "< 1 hour"),
            ("1h-24h", "1–24 hours"),
            ("gt1d", "> 1 day"),
            ("stale", "Stale: running, lease expired"),
        ]

    def queryset(self, request, queryset):
        now = timezone.now()
        hour, day = now - timedelta(hours=1), now - timedelta(days=1)
        match self.value():
            case "lt1h":
                return queryset.filter(created_at__gte=hour)
            case "1h-24h":
                return queryset.filter(created_at__lt=hour, created_at__gte=day)
            case "gt1d":
                return queryset.filter(created_at__lt=day)
            case "stale":
                # A worker that died mid-job leaves it running with a lease nobody renews.
                return queryset.filter(run_state=RunState.RUNNING, lease_expires_at__lt=now)
        return queryset


#: Widest a filename column may grow in a list before it is cut with an ellipsis (the whole
#: name is in the cell's title): the lists keep every column on screen at 1500 px.
FILENAME_MAX_WIDTH = "18em"
#: The same for short identifiers (space slug, tenant) that are usually short but need not be.
SHORT_MAX_WIDTH = "10em"


def ellipsized(text: str, max_width: str = FILENAME_MAX_WIDTH) -> str:
    """``text`` on one line, cut with an ellipsis past ``max_width``; whole in its title."""
    return format_html(
        '<span class="kfs-ellipsis" title="{}" style="display:inline-block;max-width:{};'
        'overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom">'
        "{}</span>",
        text,
        max_width,
        text,
    )


#: Run states after which a job does nothing more (its error, if any, is final for it).
TERMINAL_RUN_STATES = {
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELED,
    RunState.SUPERSEDED,
}


def progress_counters(job: CompilationJob) -> list[tuple[str, str]]:
    """The counters of a job's progress, as (label, value) pairs, in the order they happen."""
    progress = job.progress if isinstance(job.progress, dict) else {}
    counters = []
    for label, name in (("phase", "phase"), ("operation", "operation")):
        if progress.get(name):
            counters.append((label, str(progress[name])))
    if progress.get("pages_total"):
        pages = f"{progress.get('pages_parsed') or 0} of {progress['pages_total']}"
        counters.append(("pages parsed", pages))
    if progress.get("elements_parsed") is not None:
        counters.append(("elements parsed", str(progress["elements_parsed"])))
    total, embedded = progress.get("nodes_total"), progress.get("nodes_embedded")
    if total is not None:
        counters.append(("nodes", str(total)))
    if embedded is not None:
        counters.append(("embedded", f"{embedded} of {total}" if total else str(embedded)))
    return counters


def progress_percent(job: CompilationJob) -> float:
    progress = job.progress if isinstance(job.progress, dict) else {}
    percent = progress.get("percent")
    if not isinstance(percent, int | float) or isinstance(percent, bool):
        percent = job.progress_percent or 0
    return max(0.0, min(100.0, float(percent)))


def progress_label(job: CompilationJob) -> str:
    """Say where a job is in a few words, e.g. ``62% embedding 310/500``.

    The phase is the short word; the longer ``operation`` goes into the column's title.
    """
    progress = job.progress if isinstance(job.progress, dict) else {}
    percent = progress.get("percent")
    if not isinstance(percent, int | float):
        percent = job.progress_percent
    parts = [f"{percent:.0f}%"]
    step = progress.get("phase") or progress.get("operation")
    if step:
        parts.append(str(step))
    total, embedded = progress.get("nodes_total"), progress.get("nodes_embedded")
    if total and embedded is not None:
        parts.append(f"{embedded}/{total}")
    elif total:
        parts.append(f"{total} nodes")
    elif progress.get("pages_total") and not progress.get("elements_parsed"):
        parts.append(f"page {progress.get('pages_parsed') or 0}/{progress['pages_total']}")
    elif progress.get("elements_parsed"):
        parts.append(f"{progress['elements_parsed']} elements")
    return " ".join(parts)


HISTORY_LIMIT = 50  # attempts shown either side of this one; a chain longer than that is a bug


def attempt_chain(job: CompilationJob) -> list[CompilationJob]:
    """Return this job's attempt history: what it retried (backwards) and its retries (forwards)."""
    fields: tuple[str, ...] = (
        "id",
        "attempt_number",
        "stage",
        "run_state",
        "error_code",
        "created_at",
    )
    fields += ("finished_at", "retry_of_id")
    chain = [job]
    previous_id = job.retry_of_id
    while previous_id and len(chain) <= HISTORY_LIMIT:
        previous = CompilationJob.objects.only(*fields).filter(id=previous_id).first()
        if previous is None or previous in chain:
            break
        chain.append(previous)
        previous_id = previous.retry_of_id
    frontier = [job.id]
    for _ in range(HISTORY_LIMIT):
        retries = list(CompilationJob.objects.only(*fields).filter(retry_of_id__in=frontier))
        retries = [retry for retry in retries if retry not in chain]
        if not retries:
            break
        chain.extend(retries)
        frontier = [retry.id for retry in retries]
    return sorted(chain, key=lambda attempt: (attempt.attempt_number, attempt.created_at))


@admin.register(CompilationJob)
class CompilationJobAdmin(ServiceActionMixin, admin.ModelAdmin):
    list_display = (
        "document_filename",
        "space_slug",
        "tenant",
        "stage",
        "run_state_column",
        "progress_column",
        "error_column",
        "attempts",
        "age",
        "updated",
    )
    list_filter = ("run_state", "stage", "space", TenantFilter, AgeFilter)
    list_select_related = ("document", "space")
    search_fields = ("=id", "document__filename", "=task_id")
    ordering = ("-created_at",)
    actions = ["retry_jobs", "cancel_jobs"]
    readonly_fields = [f.name for f in CompilationJob._meta.fields] + [
        "attempt_history",
        "progress_bar",
        "retryable",
    ]
    fieldsets = [
        (None, {"fields": ["id", "document", "space", "tenant_id", "stage", "run_state"]}),
        ("Progress", {"fields": ["progress_bar"]}),
        ("Error", {"fields": ["error_code", "error_message", "retryable"]}),
        (
            "Execution",
            {
                "fields": [
                    "task_id",
                    "dispatched_at",
                    "execution_attempts",
                    "worker_id",
                    "lease_token",
                    "lease_expires_at",
                    "heartbeat_at",
                    "next_attempt_at",
                ]
            },
        ),
        ("Attempts", {"fields": ["attempt_number", "retry_of", "attempt_history"]}),
        ("Times", {"fields": ["created_at", "started_at", "finished_at", "updated_at"]}),
    ]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # an attempt is canceled (action), never deleted: it is the job's history

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Every field is read-only: offer no Save buttons that would save nothing.
        extra_context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
        }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- the Retry and Cancel buttons of the job page (POST, the list actions' services) -------

    def get_urls(self):
        opts = self.model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        return [
            path(
                "<path:object_id>/retry/",
                self.admin_site.admin_view(self.retry_view),
                name=f"{name}_retry",
            ),
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name=f"{name}_cancel",
            ),
            *super().get_urls(),
        ]

    def retry_view(self, request, object_id):
        return self._job_button(request, object_id, self.retry_jobs)

    def cancel_view(self, request, object_id):
        return self._job_button(request, object_id, self.cancel_jobs)

    def _job_button(self, request, object_id, action):
        """Run the list ``action`` on this one job (same service, same messages), then show
        the job's page again (its attempt history lists a new attempt)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self.get_object(request, unquote(object_id))
        if job is None:
            # ModelAdmin's own "does not exist" redirect (private; the stubs do not declare it)
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.model._meta, object_id
            )
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        action(request, CompilationJob.objects.filter(pk=job.pk))
        return HttpResponseRedirect(reverse("admin:ingestion_compilationjob_change", args=[job.pk]))

    # --- fields of the job page -----------------------------------------------------------------

    @admin.display(description="progress")
    def progress_bar(self, job: CompilationJob) -> str:
        percent = progress_percent(job)
        counters = format_html_join(
            "", "<li><span>{}</span> <strong>{}</strong></li>", progress_counters(job)
        )
        return format_html(
            '<div class="kfs-progress"><progress max="100" value="{}" aria-label="progress">'
            '{}%</progress> <strong class="kfs-percent">{}%</strong>'
            '<ul class="kfs-counters">{}</ul></div>',
            f"{percent:.0f}",
            f"{percent:.0f}",
            f"{percent:.0f}",
            counters,
        )

    @admin.display(description="retryable")
    def retryable(self, job: CompilationJob) -> str:
        """Yes or no once the job has ended with an error; "—" while it runs or without one."""
        if job.run_state not in TERMINAL_RUN_STATES or not job.error_code:
            return "—"
        return _boolean_icon(job.error_retryable)

    # --- columns ------------------------------------------------------------------------------

    @admin.display(description="document", ordering="document__filename")
    def document_filename(self, job: CompilationJob) -> str:
        return ellipsized(job.document.filename) if job.document else "(deleted)"

    @admin.display(description="space", ordering="space__slug")
    def space_slug(self, job: CompilationJob) -> str:
        return ellipsized(job.space.slug, SHORT_MAX_WIDTH)

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant(self, job: CompilationJob) -> str:
        return ellipsized(job.tenant_id, SHORT_MAX_WIDTH)

    @admin.display(description="run state", ordering="run_state")
    def run_state_column(self, job: CompilationJob) -> str:
        label = job.get_run_state_display()
        if _lease_expired(job):
            return format_html("{} <strong>(lease expired)</strong>", label)
        return label

    @admin.display(description="progress", ordering="progress_percent")
    def progress_column(self, job: CompilationJob) -> str:
        operation = (
            (job.progress or {}).get("operation", "") if isinstance(job.progress, dict) else ""
        )
        return format_html('<span title="{}">{}</span>', operation, progress_label(job))

    @admin.display(description="error", ordering="error_code")
    def error_column(self, job: CompilationJob) -> str:
        if not job.error_code:
            return ""
        return format_html('<span title="{}">{}</span>', job.error_message, job.error_code)

    @admin.display(description="attempts", ordering="attempt_number")
    def attempts(self, job: CompilationJob) -> str:
        runs = job.execution_attempts
        return f"#{job.attempt_number} · {runs} run{'' if runs == 1 else 's'}"

    @admin.display(description="age", ordering="-created_at")
    def age(self, job: CompilationJob) -> str:
        return timesince(job.created_at, depth=1)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, job: CompilationJob) -> str:
        """How long ago, the date and time in the title (a full date takes 170 px)."""
        return format_html(
            '<span title="{}">{} ago</span>',
            _when(job.updated_at),
            timesince(job.updated_at, depth=1),
        )

    @admin.display(description="attempt history")
    def attempt_history(self, job: CompilationJob) -> str:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _job_link(attempt, current=attempt.pk == job.pk),
                    attempt.attempt_number,
                    attempt.get_stage_display(),
                    attempt.get_run_state_display(),
                    attempt.error_code or "–",
                    _when(attempt.created_at),
                    _when(attempt.finished_at),
                )
                for attempt in attempt_chain(job)
            ),
        )
        return format_html(
            '<table class="attempt-history"><thead><tr><th>job</th><th>attempt</th>'
            "<th>stage</th><th>run state</th><th>error</th><th>created</th><th>finished</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # --- actions: each calls the service per job and reports every outcome ---------------------

    @admin.action(description="Retry selected jobs", permissions=["change"])
    def retry_jobs(self, request, queryset) -> None:
        # The service retries a job whatever its error; one whose error is terminal (not
        # retryable: the same bytes fail the same way) is retried with a warning saying so.
        terminal = {
            job_id: (filename, code)
            for job_id, filename, code in queryset.filter(
                run_state=RunState.FAILED, error_retryable=False
            )
            .exclude(error_code="")
            .values_list("id", "document__filename", "error_code")
        }

        def retry(job_id):
            attempt = operations.retry_job(job_id)
            if job_id in terminal:
                filename, code = terminal[job_id]
                self.message_user(
                    request,
                    f"Job {job_id} ({filename}): its error {code} is terminal (not retryable); "
                    "the new attempt will fail the same way unless the document or the "
                    "settings changed.",
                    messages.WARNING,
                )
            return attempt

        done = self._for_each_job(request, queryset, retry)
        if done:
            self.message_user(request, f"Queued a new attempt for {_jobs(done)}.", messages.SUCCESS)

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset) -> None:
        done = self._for_each_job(request, queryset, operations.cancel_job)
        if done:
            self.message_user(request, f"Canceled {_jobs(done)}.", messages.SUCCESS)

    def _for_each_job(self, request, queryset, operation) -> int:
        """Apply ``operation(job_id)`` to every selected job; warn about each one refused."""
        rows = queryset.values_list("id", "document__filename")
        labelled = ((job_id, f"Job {job_id} ({filename})") for job_id, filename in rows)
        return len(self.apply_each(request, labelled, operation))


def _jobs(count: int) -> str:
    return f"{count} job{'' if count == 1 else 's'}"


def _job_link(job: CompilationJob, *, current: bool) -> str:
    if current:
        return format_html("<strong>{}</strong> (this job)", job.pk)
    url = reverse("admin:ingestion_compilationjob_change", args=[job.pk])
    return format_html('<a href="{}">{}</a>', url, job.pk)


def _lease_expired(job: CompilationJob) -> bool:
    return bool(
        job.run_state == RunState.RUNNING
        and job.lease_expires_at
        and job.lease_expires_at < timezone.now()
    )


def _when(moment) -> str:
    return date_format(localtime(moment), "DATETIME_FORMAT") if moment else "–"


@admin.register(ParseArtifact)
class ParseArtifactAdmin(admin.ModelAdmin):
    list_display = ("id", "document", "parser", "page_count", "created_at")
    raw_id_fields = ("job", "document")
    readonly_fields = (
        "id",
        "job",
        "document",
        "parser",
        "artifact_hash",
        "page_count",
        "pages_without_text",
        "ocr_pages",
        "warnings",
        "assets",
        "created_at",
    )
    exclude = ("elements",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # derived rows: they go with their document (or a new attempt)


@admin.register(KnowledgeNode)
class KnowledgeNodeAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "document",
        "chunk_index",
        "kind",
        "page_number",
        "start_offset",
        "end_offset",
    )
    list_select_related = ("document",)
    raw_id_fields = ("space", "document")
    search_fields = ("=id", "document__filename")
    readonly_fields = [f.name for f in KnowledgeNode._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # derived rows: they go with their document (or a new attempt)
