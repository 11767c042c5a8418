"""URL map: the product API under ``/v1/``, Dify's internal routes under ``/internal/``,
probes, and Django admin. Each app's routes live in its ``urls.py``; this module includes them."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from retrieval.api import mcp as mcp_api
from spaces import urls as spaces_urls

from . import health, internal, openapi
from .openapi.views import OpenApiView

# The route annotations of the OpenAPI document (every schema generation loads this URLconf).
openapi.register()

handler400 = "knowledgefs.errors.handler400"
handler403 = "knowledgefs.errors.handler403"
handler404 = "knowledgefs.errors.handler404"
handler500 = "knowledgefs.errors.handler500"

v1: list[URLPattern | URLResolver] = [
    # Knowledge spaces and their profiles (spaces/urls.py).
    path("", include(spaces_urls.urlpatterns)),
    # Documents, their text and compilation jobs (ingestion/urls.py).
    path("", include("ingestion.urls")),
    # Retrieval tests, answers, golden questions and research tasks (retrieval/urls.py).
    path("", include("retrieval.urls")),
]

internal_routes: list[URLPattern | URLResolver] = [
    path("", include(spaces_urls.internal_urlpatterns)),
    path(
        "capability-grants/<str:grant_id>/revoke",
        internal.RevokeGrantView.as_view(),
        name="internal-grant-revoke",
    ),
    # Upgrade bridge: workspace cutover ledger, dataset upgrades, file leases.
    path("", include("upgrades.urls")),
]

urlpatterns = [
    path("health", health.health, name="health"),
    path("ready", health.ready, name="ready"),
    path("openapi.json", OpenApiView.as_view(), name="openapi"),
    path("admin/", admin.site.urls),
    path("v1/", include(v1)),
    path("internal/", include(internal_routes)),
    # The MCP server of the knowledge filesystem (docs/filesystem.md), streamable HTTP.
    path("mcp", mcp_api.endpoint, name="mcp"),
]
