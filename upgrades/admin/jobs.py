"""Admin for upgrade jobs, their documents and file leases.

Read-only screens: every change goes through the services (the action "Retry failed upgrades"
calls :func:`upgrades.services.snapshot.retry_upgrade`). Jobs cannot be added or deleted here.
A stuck job reads as: its status and stage, the claim (``task_id``, claimed at, step started
at), attempts of the current step, the countdown (``next_step_at``), the last error, and per
document its checkpoint.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Case, IntegerField, Q, Value, When
from django.forms.models import BaseInlineFormSet
from django.urls import reverse
from django.utils.html import format_html

from knowledgefs.admin import ReadOnlyAdminMixin, ServiceActionMixin
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


INLINE_ROW_CAP = 100
"""At most this many documents and file leases are inlined on a job's page (a job may hold
5,000 documents: 5,000 rows made the page ~20 MiB and ~50 s); the rest are in the document
list linked from the page."""


class CappedInlineFormSet(BaseInlineFormSet):
    """The inline's rows for this job, cut to :data:`INLINE_ROW_CAP` after the inline's
    ordering (the rows an operator needs first come first)."""

    def get_queryset(self):
        if not hasattr(self, "_capped"):
            self._capped = super().get_queryset()[:INLINE_ROW_CAP]
        return self._capped


#: Documents needing a look first: failed, dead-lettered, not yet submitted, then those whose
#: state is not reconciled yet, then the rest.
DOCUMENT_ATTENTION = Case(
    When(Q(status="failed") | Q(state_dead_lettered_at__isnull=False), then=Value(0)),
    When(~Q(status="succeeded"), then=Value(1)),
    When(state_reconciled_at__isnull=True, then=Value(2)),
    default=Value(3),
    output_field=IntegerField(),
)


class UpgradeDocumentInline(ReadOnlyInline):
    model = UpgradeDocument
    formset = CappedInlineFormSet
    verbose_name_plural = (
        f"upgrade documents (at most {INLINE_ROW_CAP}, those needing a look first)"
    )
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

    def get_queryset(self, request):
        return super().get_queryset(request).order_by(DOCUMENT_ATTENTION, "id")


class UpgradeFileLeaseInline(ReadOnlyInline):
    model = UpgradeFileLease
    formset = CappedInlineFormSet
    verbose_name_plural = f"upgrade file leases (at most {INLINE_ROW_CAP}, unreleased first)"
    fields = (
        "upload_file_id",
        "status",
        "expires_at",
        "released_at",
        "cleanup_requested_at",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        released = Case(
            When(status="released", then=Value(1)), default=Value(0), output_field=IntegerField()
        )
        return super().get_queryset(request).order_by(released, "id")


@admin.register(UpgradeJob)
class UpgradeJobAdmin(ServiceActionMixin, admin.ModelAdmin):
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
    readonly_fields = [f.name for f in UpgradeJob._meta.fields] + ["document_list"]
    inlines = [UpgradeDocumentInline, UpgradeFileLeaseInline]
    actions = [
        "retry_failed_upgrades",
        "abandon_failed_upgrades",
        rearm_dead_lettered_reconciliation,
    ]
    show_full_result_count = False
    ordering = ("-created_at",)

    @admin.display(description="documents (done/failed/total)")
    def counts(self, job: UpgradeJob) -> str:
        return f"{job.completed_documents}/{job.failed_documents}/{job.total_documents}"

    @admin.display(description="all documents")
    def document_list(self, job: UpgradeJob) -> str:
        url = reverse("admin:upgrades_upgradedocument_changelist") + f"?job={job.pk}"
        return format_html(
            '<a href="{}">All {} documents of this upgrade</a> (filter by status, dead-lettered)',
            url,
            job.total_documents,
        )

    def has_add_permission(self, request) -> bool:
        return False  # jobs come from Dify's snapshot route

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the job is the upgrade's record

    def has_change_permission(self, request, obj=None) -> bool:
        # The change page is a read-only view; the retry action needs "change".
        return obj is None and super().has_change_permission(request, obj)

    @admin.action(description="Retry failed upgrades", permissions=["change"])
    def retry_failed_upgrades(self, request, queryset) -> None:
        rows = queryset.values_list("id", "status")

        def retry(row) -> bool:
            job_id, status = row
            _, done = snapshot.retry_upgrade(job_id)
            if not done:
                self.message_user(
                    request, f"Upgrade {job_id} is {status}: left unchanged", messages.INFO
                )
            return done

        retried = sum(self.apply_each(request, ((r, f"Upgrade {r[0]}") for r in rows), retry))
        if retried:
            self.message_user(
                request,
                f"Queued {retried} upgrade{'s' if retried != 1 else ''} again.",
                messages.SUCCESS,
            )

    @admin.action(description="Abandon failed upgrades (allow a new one)", permissions=["change"])
    def abandon_failed_upgrades(self, request, queryset) -> None:
        rows = queryset.values_list("id", flat=True)
        results = self.apply_each(
            request, ((j, f"Upgrade {j}") for j in rows), snapshot.abandon_upgrade
        )
        abandoned = sum(done for _, done in results)
        if abandoned:
            self.message_user(request, f"Abandoned {abandoned} upgrade(s).", messages.SUCCESS)


class DeadLetteredFilter(admin.SimpleListFilter):
    """Documents whose state reconciliation was dead-lettered (or not)."""

    title = "dead-lettered"
    parameter_name = "dead_lettered"

    def lookups(self, request, model_admin):
        return (("yes", "Yes"), ("no", "No"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(state_dead_lettered_at__isnull=self.value() == "no")
        return queryset


@admin.register(UpgradeDocument)
class UpgradeDocumentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only, paginated list of upgrade documents; ``?job=<upgrade id>`` narrows it to one
    job (the link on the job's page), filters by status and dead-lettered."""

    list_display = (
        "id",
        "job",
        "legacy_document_id",
        "name",
        "status",
        "last_error_code",
        "state_reconciled_at",
        "state_dead_lettered_at",
    )
    list_filter = ("status", DeadLetteredFilter)
    search_fields = ("=job__id", "=legacy_document_id", "=upload_file_id")
    readonly_fields = [f.name for f in UpgradeDocument._meta.fields]
    raw_id_fields = ("job", "document")
    list_select_related = ("job",)
    list_per_page = 100
    show_full_result_count = False
    ordering = ("job", "id")

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        return lookup in ("job", "job__id__exact") or super().lookup_allowed(lookup, value, request)
