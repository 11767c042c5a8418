"""DRF permission that enforces the operation registry (:mod:`knowledgefs.auth.operations`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import exceptions, permissions

from ..errors import Conflict
from . import gates, grants
from .authentication import refuse
from .capability import CapabilityClaims, CapabilityError
from .operations import Operation, operation_for, same_id
from .principal import Principal

if TYPE_CHECKING:  # DRF loads this class while rest_framework.views is still importing
    from rest_framework.request import Request
    from rest_framework.views import APIView


class OperationPermission(permissions.BasePermission):
    """Every request must match its route's registered operation.

    - A method the route does not serve is 405; one it serves without a registered operation
      is refused (403 ``operation_not_registered``).
    - Internal operations take only the inner API key; product operations never do.
    - A capability token must name the operation's action (403 ``action_not_permitted``), a
      caller kind the operation allows (403 ``caller_kind_not_permitted``) and the very
      resource the request names (403 ``resource_not_permitted``); then its grant must not be
      revoked or reused for another tuple (403 ``grant_revoked`` / ``grant_mismatch``), and
      is recorded.
    - Product operations then pass every tenant gate (:mod:`knowledgefs.auth.gates`).
    - API keys pass here; their space scope is applied in every queryset
      (:func:`spaces.services.get_space`), so a foreign or out-of-scope id is a 404.
    """

    def has_permission(self, request: Request, view: APIView) -> bool:
        method = request.method or "GET"  # DRF's request always has its method
        operation = operation_for(view, method)
        if operation is None:
            handled = method.upper() != "OPTIONS" and hasattr(view, method.lower())
            if not handled:  # not a method of this route: 405 whoever asks (with Allow)
                raise exceptions.MethodNotAllowed(method)
            raise exceptions.PermissionDenied(
                f"{method} has no registered operation on this route",
                code="operation_not_registered",
            )
        # Every authenticator answers a Principal; unauthenticated, request.user is None.
        principal = request.user
        if not isinstance(principal, Principal) or not principal.is_authenticated:
            raise exceptions.NotAuthenticated("authentication credentials were not provided")
        if operation.internal != (principal.kind == "internal"):
            raise exceptions.PermissionDenied(
                "this route does not accept these credentials", code="credential_not_permitted"
            )
        if principal.kind == "capability":
            self._check_capability(operation, principal, request, view)
        if not operation.internal:
            self._check_workspace_gate(principal)
        return True

    @staticmethod
    def _check_workspace_gate(principal: Principal) -> None:
        """Product routes serve only while every tenant gate (:mod:`knowledgefs.auth.gates`) is
        open; the first refusal answers 409 with its code."""
        closed = gates.refusal(principal.tenant_id)
        if closed is not None:
            raise Conflict(closed.message, code=closed.code, details=closed.details)

    @staticmethod
    def _check_capability(
        operation: Operation, principal: Principal, request: Request, view: APIView
    ) -> None:
        if principal.action != operation.action:
            raise exceptions.PermissionDenied(
                f"the token's action is not {operation.action!r}", code="action_not_permitted"
            )
        if principal.caller_kind not in operation.callers:
            raise exceptions.PermissionDenied(
                f"{operation.action!r} is not open to {principal.caller_kind} callers",
                code="caller_kind_not_permitted",
            )
        binding, resource = operation.binding, principal.resource
        if resource is None or resource.type != binding.type:
            raise exceptions.PermissionDenied(
                f"{operation.action!r} needs a token for a {binding.type} resource",
                code="resource_not_permitted",
            )
        if binding.source != "none":
            ident, parent = binding.values(request, getattr(view, "kwargs", {}) or {})
            if not same_id(ident, resource.id) or (
                binding.parent_field is not None and not same_id(parent, resource.parent_id)
            ):
                raise exceptions.PermissionDenied(
                    "the token was issued for a different resource",
                    code="resource_not_permitted",
                )
        # Namespace-wide operations too: a revoked grant never lists or creates anything.
        claims = request.auth
        assert isinstance(claims, CapabilityClaims)  # what a capability principal comes with
        try:
            grants.admit_grant(claims)
        except CapabilityError as error:
            raise refuse(error) from None
