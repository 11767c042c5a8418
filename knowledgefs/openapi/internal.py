"""Annotations of Dify's internal routes (provision and delete a space,
:mod:`spaces.api.internal`; grant revocation, :mod:`knowledgefs.internal`) for the OpenAPI
document (:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema

from .common import BOOLEAN, IDEMPOTENCY_KEY, NAMESPACE_BODY, STRING, annotate, body, shape


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    from spaces.api.internal import ProvisionSerializer
    from spaces.api.serializers import KnowledgeSpaceSerializer

    annotate(
        "spaces.api.internal.ProvisionSpaceView",
        post=extend_schema(
            summary="Create a tenant's space by slug, or return it",
            request=ProvisionSerializer,
            parameters=[IDEMPOTENCY_KEY],
            responses={200: KnowledgeSpaceSerializer, 201: KnowledgeSpaceSerializer},
        ),
    )
    annotate(
        "spaces.api.internal.DeleteSpaceView",
        post=extend_schema(
            summary="Delete a tenant's space",
            request=NAMESPACE_BODY,
            responses={204: OpenApiResponse(description="Deleted.")},
        ),
    )
    annotate(
        "knowledgefs.internal.RevokeGrantView",
        post=extend_schema(
            summary="Revoke a capability grant",
            request=body("Why (kept with the grant).", {"reason": {"type": "string"}}),
            responses={
                200: shape(
                    "The grant and whether this call revoked it.",
                    {"grant_id": STRING, "revoked_at": STRING, "newly_revoked": BOOLEAN},
                )
            },
        ),
    )
