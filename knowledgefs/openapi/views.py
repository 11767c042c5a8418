"""``GET /openapi.json``: the API's OpenAPI 3 document."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.views import SpectacularJSONAPIView

if TYPE_CHECKING:
    from rest_framework.authentication import BaseAuthentication
    from rest_framework.permissions import BasePermission
    from rest_framework.throttling import BaseThrottle


class OpenApiView(SpectacularJSONAPIView):
    """``GET /openapi.json``: the schema, to anyone (no credential, no rate limit), like
    ``/health``. Rendered as ``application/vnd.oai.openapi+json`` (or ``application/json``
    when asked for)."""

    authentication_classes: list[type[BaseAuthentication]] = []
    permission_classes: list[type[BasePermission]] = []
    throttle_classes: list[type[BaseThrottle]] = []
