"""Admin for cutover ledgers and cleanup authorizations.

Ledgers are read-only here (Dify drives them through the internal routes); the list shows each
workspace's phase, version, switches and the runtime gate's answer. Cleanup authorizations are
requested with the add form and moved on with the *Approve*, *Start* and *Complete* actions,
all through :mod:`upgrades.services.cleanup`: the acting operator is the logged-in user, so the
requester's own approval is refused (``four_eyes_required``) and reported as an error message.
Nothing here can be deleted.
"""

from __future__ import annotations

from typing import cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from knowledgefs.admin import ReadOnlyAdminMixin
from knowledgefs.errors import ServiceError

from ..models import CleanupAuthorization, WorkspaceCutoverLedger
from ..services import cleanup
from ..services.cutover import gate_state


@admin.register(WorkspaceCutoverLedger)
class WorkspaceCutoverLedgerAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: a ledger is created by Dify through the internal route, and every change is a
    compare-and-set step of the service."""

    list_display = (
        "tenant_id",
        "phase",
        "cas_version",
        "gate",
        "rolled_back_at",
        "product_routes_enabled",
        "capability_v2_enabled",
        "integrated_mode_enabled",
        "legacy_acl_read_only",
        "cutover_at",
        "irreversible_cleanup_at",
    )
    list_filter = ("phase",)
    search_fields = ("=tenant_id",)
    ordering = ("tenant_id",)
    show_full_result_count = False

    @admin.display(description="runtime gate")
    def gate(self, obj) -> str:
        state = gate_state(obj)
        return "open" if state.open else f"closed: {state.code} ({state.reason})"

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields] + ["gate"]


class CleanupRequestForm(forms.ModelForm):
    """The add form: the workspace's ledger and a reason. The request is made by the service
    when the form validates, so its refusals show as form errors."""

    requested_by = ""  # set per request by the admin

    class Meta:
        model = CleanupAuthorization
        fields = ("ledger", "reason")

    def clean(self):
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns (typed optional by the stubs)
        ledger = data.get("ledger")
        if ledger is not None and not self.errors:
            try:
                self.created = cleanup.request_cleanup(
                    ledger.tenant_id, requested_by=self.requested_by, reason=data.get("reason", "")
                )
            except ServiceError as exc:
                raise ValidationError(f"{exc.code}: {exc.message}") from None
        return data


def _report(admin_view, request, queryset, verb: str, call) -> None:
    """Run ``call(authorization, operator)`` per row; one message per row, errors included."""
    operator = request.user.get_username()
    for authorization in queryset:
        try:
            done = call(authorization, operator)
        except ServiceError as exc:
            admin_view.message_user(
                request,
                f"Cleanup of {authorization.tenant_id} refused: {exc.code}: {exc.message}",
                messages.ERROR,
            )
            continue
        admin_view.message_user(
            request,
            f"{verb} the cleanup of {done.tenant_id} (now {done.status}, version "
            f"{done.row_version}).",
            messages.SUCCESS,
        )


@admin.register(CleanupAuthorization)
class CleanupAuthorizationAdmin(admin.ModelAdmin):
    form = CleanupRequestForm
    list_display = (
        "tenant_id",
        "status",
        "requested_by",
        "approved_by",
        "approval_expires_at",
        "started_by",
        "completed_by",
        "row_version",
        "requested_at",
    )
    list_filter = ("status",)
    search_fields = ("=tenant_id", "requested_by", "approved_by")
    ordering = ("-requested_at",)
    actions = ("approve_authorizations", "start_cleanups", "complete_cleanups")

    def get_form(self, request, obj=None, change=False, **kwargs):
        # a subclass of self.form, CleanupRequestForm, made by modelform_factory
        form = cast(
            type[CleanupRequestForm], super().get_form(request, obj, change=change, **kwargs)
        )
        form.requested_by = request.user.get_username()
        return form

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return [f.name for f in self.model._meta.fields]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("ledger", "reason")
        return [f.name for f in self.model._meta.fields]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"show_save": False, "show_save_and_continue": False, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return  # read-only: transitions are the actions
        created = form.created
        for field in self.model._meta.concrete_fields:
            setattr(obj, field.attname, getattr(created, field.attname))
        obj._state.adding = False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the audit trail of an irreversible cleanup stays

    @admin.action(description="Approve (four-eyes: not the requester)", permissions=["change"])
    def approve_authorizations(self, request, queryset) -> None:
        _report(
            self,
            request,
            queryset,
            "Approved",
            lambda a, who: cleanup.approve(
                a.id, expected_row_version=a.row_version, approved_by=who
            ),
        )

    @admin.action(
        description="Start the cleanup (irreversible: ends rollback)", permissions=["change"]
    )
    def start_cleanups(self, request, queryset) -> None:
        _report(
            self,
            request,
            queryset,
            "Started",
            lambda a, who: cleanup.start(
                a.id,
                expected_row_version=a.row_version,
                started_by=who,
                evidence={"via": "admin", "operator": who},
            ),
        )

    @admin.action(description="Mark the cleanup completed", permissions=["change"])
    def complete_cleanups(self, request, queryset) -> None:
        _report(
            self,
            request,
            queryset,
            "Completed",
            lambda a, who: cleanup.complete(
                a.id,
                expected_row_version=a.row_version,
                completed_by=who,
                evidence={"via": "admin", "operator": who},
            ),
        )
