"""DRF authentication for Dify capability tokens and for the inner API key.

Product routes accept ``Authorization: Bearer <capability token>`` (when
``KNOWLEDGE_FS_CAPABILITY_V2_ENABLED``) and ``Authorization: Bearer kfs_…`` service API keys
(:class:`spaces.authentication.ApiKeyAuthentication`). Internal routes accept only
``X-Inner-Api-Key`` and product routes never do: each view lists its classes.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import TYPE_CHECKING

from django.conf import settings
from rest_framework import authentication, exceptions

from .capability import CapabilityClaims, CapabilityError, looks_like_jwt, verify_token
from .principal import Principal

if TYPE_CHECKING:  # DRF loads these classes while rest_framework.views is still importing
    from rest_framework.request import Request

INNER_API_HEADER = "HTTP_X_INNER_API_KEY"


def refuse(error: CapabilityError) -> exceptions.APIException:
    """The DRF exception for a refused token: 401 ``AuthenticationFailed`` or 403."""
    if error.status == 403:
        return exceptions.PermissionDenied(error.message, code=error.code)
    return exceptions.AuthenticationFailed(error.message, code=error.code)


def principal_from_claims(claims: CapabilityClaims) -> Principal:
    """The caller a verified token describes; the tenant comes only from ``namespace_id``.

    A ``knowledge_space`` token reaches that space, a child resource's token its parent space,
    a ``namespace`` token every space of the tenant. Ids that are not UUIDs reach nothing.
    """
    resource = claims.resource
    space_ids: frozenset[uuid.UUID] | None
    if resource.type == "namespace":
        space_ids = None
    else:
        raw = resource.id if resource.type == "knowledge_space" else resource.parent_id
        try:
            space_ids = frozenset({uuid.UUID(raw or "")})
        except ValueError:
            space_ids = frozenset()
    # Idempotency and throttle records are keyed by a digest, never by the subject itself.
    digest = hashlib.sha256(f"{claims.namespace_id}\x00{claims.subject}".encode()).hexdigest()
    return Principal(
        tenant_id=claims.namespace_id,
        space_ids=space_ids,
        kind="capability",
        subject=f"cap:{digest[:40]}",
        caller_kind=claims.caller_kind,
        grant_id=claims.grant_id,
        action=claims.action,
        resource=resource,
    )


class CapabilityTokenAuthentication(authentication.BaseAuthentication):
    """Verifies capability v2 tokens; leaves anything else to the next class (API keys).

    ``request.auth`` is the verified :class:`CapabilityClaims`. The grant is checked and
    recorded by :class:`knowledgefs.auth.permissions.OperationPermission` once the token
    matches the route's operation, so a token refused there leaves no grant behind.
    """

    def authenticate(self, request: Request) -> tuple[Principal, CapabilityClaims] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not looks_like_jwt(token):
            return None
        if not settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED:
            raise exceptions.AuthenticationFailed(
                "capability tokens are not enabled (KNOWLEDGE_FS_CAPABILITY_V2_ENABLED)",
                code="capability_tokens_disabled",
            )
        try:
            claims = verify_token(token, jwks_text=settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS)
        except CapabilityError as error:
            raise refuse(error) from None
        return principal_from_claims(claims), claims

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="knowledgefs"'


class InnerApiKeyAuthentication(authentication.BaseAuthentication):
    """``X-Inner-Api-Key`` for internal routes, compared in constant time with
    ``DIFY_INNER_API_KEY``. The principal has no tenant: internal routes name it in the body."""

    def authenticate(self, request: Request) -> tuple[Principal, None] | None:
        presented = request.META.get(INNER_API_HEADER)
        if presented is None:
            return None
        expected = settings.DIFY_INNER_API_KEY
        if not expected:
            raise exceptions.AuthenticationFailed(
                "internal routes are off: DIFY_INNER_API_KEY is not set",
                code="inner_api_disabled",
            )
        if not hmac.compare_digest(presented.encode("latin-1"), expected.encode("latin-1")):
            raise exceptions.AuthenticationFailed(
                "invalid inner API key", code="invalid_inner_api_key"
            )
        return Principal(tenant_id="", kind="internal", subject="dify-inner-api"), None

    def authenticate_header(self, request: Request) -> str:
        return "X-Inner-Api-Key"
