"""``GET /openapi.json``: the API's OpenAPI 3 document."""

from __future__ import annotations

from drf_spectacular.views import SpectacularJSONAPIView


class OpenApiView(SpectacularJSONAPIView):
    """``GET /openapi.json``: the schema, to anyone (no credential, no rate limit), like
    ``/health``. Rendered as ``application/vnd.oai.openapi+json`` (or ``application/json``
    when asked for)."""

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []
