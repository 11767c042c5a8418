"""The core's internal route for Dify (``/internal/…``, inner API key only): revoking a
capability grant. The base view is :mod:`knowledgefs.api`; the spaces' internal views are
:mod:`spaces.api.internal`."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from .api import InternalView, internal
from .auth import grants
from .errors import InvalidInput


class RevokeSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class RevokeGrantView(InternalView):
    operations = {"POST": internal("internal.capability_grants.revoke")}

    def post(self, request: Request, grant_id: str) -> Response:
        """Cut a capability grant off; its tokens are refused from the next request on."""
        if not 1 <= len(grant_id) <= 128 or not grant_id.isascii() or not grant_id.isprintable():
            raise InvalidInput(
                "grant_id must be 1-128 printable ASCII characters", code="invalid_grant_id"
            )
        body = RevokeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        grant, newly = grants.revoke_grant(grant_id, reason=body.validated_data["reason"])
        return Response(
            {"grant_id": grant.grant_id, "revoked_at": grant.revoked_at, "newly_revoked": newly}
        )
