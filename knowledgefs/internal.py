"""Internal routes for Dify only (``/internal/…``), authenticated by ``X-Inner-Api-Key``.

They name the tenant in the body (``namespace_id``) because the inner API key belongs to Dify,
not to a tenant. Product credentials (API keys, capability tokens) are never accepted here, and
the inner API key is never accepted on product routes.
"""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from spaces import services as spaces
from spaces.serializers import KnowledgeSpaceSerializer

from .auth import grants
from .auth.authentication import InnerApiKeyAuthentication
from .auth.operations import Binding, Operation
from .errors import InvalidInput
from .idempotency import fingerprint, idempotent

NO_CALLERS: frozenset[str] = frozenset()


def internal(action: str, binding: Binding | None = None) -> Operation:
    """An operation reached only with the inner API key."""
    return Operation(action, binding or Binding(type="namespace", source="none"), NO_CALLERS, True)


class InternalView(APIView):
    authentication_classes = [InnerApiKeyAuthentication]


class ProvisionSerializer(serializers.Serializer):
    namespace_id = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=160, trim_whitespace=True)
    slug = serializers.CharField(max_length=160)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class NamespaceSerializer(serializers.Serializer):
    namespace_id = serializers.CharField(max_length=64)


class RevokeSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ProvisionSpaceView(InternalView):
    operations = {"POST": internal("internal.knowledge_spaces.provision")}

    def post(self, request):
        """Create a tenant's space by slug, or return it: 201 when created, 200 when it was."""
        body = ProvisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data

        def provision() -> Response:
            space, created = spaces.provision_space(
                data["namespace_id"],
                name=data["name"],
                slug=data["slug"],
                description=data["description"],
            )
            return Response(
                KnowledgeSpaceSerializer(space).data,
                status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            )

        return idempotent(
            request, fingerprint("internal.provision", str(sorted(data.items()))), provision
        )


class DeleteSpaceView(InternalView):
    operations = {
        "POST": internal(
            "internal.knowledge_spaces.delete", Binding("knowledge_space", "path", "space_id")
        )
    }

    def post(self, request, space_id):
        """Delete a tenant's space (body ``{"namespace_id"}``); 204, or 404 if not the tenant's."""
        body = NamespaceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = spaces.validate_tenant_id(body.validated_data["namespace_id"])
        spaces.delete_space(spaces.Principal(tenant_id=tenant, kind="internal"), space_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RevokeGrantView(InternalView):
    operations = {"POST": internal("internal.capability_grants.revoke")}

    def post(self, request, grant_id):
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
