"""The core's admin screens, and the mixins every app's admin shares: :class:`ReadOnlyAdminMixin`
(a screen, or an inline, nobody adds to, edits or deletes from) and :class:`ServiceActionMixin`
(an action that calls a service per selected row and reports each refusal)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .auth import grants
from .errors import ServiceError
from .models import CapabilityGrant, IdempotencyRecord

if TYPE_CHECKING:  # ModelAdmin is generic in the stubs only (no runtime __class_getitem__)
    _IdempotencyRecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
    _CapabilityGrantAdminBase = admin.ModelAdmin[CapabilityGrant]
else:
    _IdempotencyRecordAdminBase = _CapabilityGrantAdminBase = admin.ModelAdmin


class ReadOnlyAdminMixin:
    """No add, change or delete permission (for a ModelAdmin or an inline; put it first)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ServiceActionMixin:
    """Admin actions that call a service once per selected row."""

    message_user: Callable[..., None]  # ModelAdmin's, which this mixin is used with

    def apply_each(
        self,
        request: HttpRequest,
        rows: Iterable[tuple[Any, str]],
        operation: Callable[[Any], Any],
    ) -> list[Any]:
        """Call ``operation(key)`` for each ``(key, label)`` of ``rows``, in order; a refusal
        (:class:`~knowledgefs.errors.ServiceError`) becomes the warning ``"{label}: {message}"``
        and the next row is tried. Returns the results of the calls that succeeded."""
        results: list[Any] = []
        for key, label in rows:
            try:
                result = operation(key)
            except ServiceError as exc:
                self.message_user(request, f"{label}: {exc.message}", messages.WARNING)
            else:
                results.append(result)
        return results


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(_IdempotencyRecordAdminBase):
    list_display = ("key", "owner", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("key", "owner")
    readonly_fields = ("owner", "key", "fingerprint", "status", "body", "created_at")
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(CapabilityGrant)
class CapabilityGrantAdmin(ReadOnlyAdminMixin, _CapabilityGrantAdminBase):
    """Grants are written by accepted tokens and Dify's revocations: read-only here, except the
    revoke action, which goes through :func:`knowledgefs.auth.grants.revoke_grant` (never a
    delete: deleting a revoked grant would let its tokens in again)."""

    list_display = (
        "grant_id",
        "tenant_id",
        "caller_kind",
        "action",
        "resource_type",
        "resource_id",
        "first_seen_at",
        "last_seen_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "caller_kind", "action")
    search_fields = ("grant_id", "tenant_id", "resource_id", "subject")
    readonly_fields = [f.name for f in CapabilityGrant._meta.fields]
    actions = ["revoke_grants"]
    show_full_result_count = False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        """Revoking needs the change permission, although the screen is otherwise read-only."""
        return request.user.has_perm("knowledgefs.change_capabilitygrant")

    @admin.action(description="Revoke selected grants", permissions=["revoke"])
    def revoke_grants(self, request: HttpRequest, queryset: QuerySet[CapabilityGrant]) -> None:
        revoked = sum(
            grants.revoke_grant(grant_id, reason=f"revoked in admin by {request.user}")[1]
            for grant_id in queryset.values_list("grant_id", flat=True)
        )
        self.message_user(request, f"Revoked {revoked} grant(s).", messages.SUCCESS)
