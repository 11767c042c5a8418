"""Dify's internal routes for knowledge spaces: provision a tenant's space by slug, delete one.

Reached only with the inner API key (:class:`knowledgefs.api.InternalView`); the tenant is the
body's ``namespace_id``.
"""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.response import Response

from knowledgefs.api import InternalView, internal
from knowledgefs.auth.operations import Binding
from knowledgefs.idempotency import fingerprint, idempotent
from spaces import services as spaces

from .serializers import KnowledgeSpaceSerializer


class ProvisionSerializer(serializers.Serializer):
    namespace_id = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=160, trim_whitespace=True)
    slug = serializers.CharField(max_length=160)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class NamespaceSerializer(serializers.Serializer):
    namespace_id = serializers.CharField(max_length=64)


class ProvisionSpaceView(InternalView):
    integrated_mode = True
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
