"""URL map: the product API under ``/v1/``, Dify's internal routes under ``/internal/``,
probes, and Django admin."""

from django.contrib import admin
from django.urls import include, path

from spaces.api import (
    EmbeddingProfileView,
    KnowledgeSpaceDetailView,
    KnowledgeSpaceListView,
    ProfileValidationView,
    RetrievalProfileView,
)
from upgrades import cutover_api

from . import health, internal, openapi
from .openapi.views import OpenApiView

# The route annotations of the OpenAPI document (every schema generation loads this URLconf).
openapi.register()

handler400 = "knowledgefs.errors.handler400"
handler403 = "knowledgefs.errors.handler403"
handler404 = "knowledgefs.errors.handler404"
handler500 = "knowledgefs.errors.handler500"

v1 = [
    path("knowledge-spaces", KnowledgeSpaceListView.as_view(), name="space-list"),
    path(
        "knowledge-spaces/<str:space_id>", KnowledgeSpaceDetailView.as_view(), name="space-detail"
    ),
    path(
        "knowledge-spaces/<str:space_id>/embedding-profile",
        EmbeddingProfileView.as_view(),
        name="space-embedding-profile",
    ),
    path(
        "knowledge-spaces/<str:space_id>/retrieval-profile",
        RetrievalProfileView.as_view(),
        name="space-retrieval-profile",
    ),
    path(
        "knowledge-spaces/<str:space_id>/profile-validation",
        ProfileValidationView.as_view(),
        name="space-profile-validation",
    ),
    # Documents, their text and compilation jobs (ingestion/urls.py).
    path("", include("ingestion.urls")),
    # Retrieval tests, answers, golden questions and research tasks (retrieval/urls.py).
    path("", include("retrieval.urls")),
]

internal_routes = [
    path(
        "knowledge-spaces/provision",
        internal.ProvisionSpaceView.as_view(),
        name="internal-space-provision",
    ),
    path(
        "knowledge-spaces/<str:space_id>/delete",
        internal.DeleteSpaceView.as_view(),
        name="internal-space-delete",
    ),
    path(
        "capability-grants/<str:grant_id>/revoke",
        internal.RevokeGrantView.as_view(),
        name="internal-grant-revoke",
    ),
    # Upgrade bridge: workspace cutover ledger.
    path(
        "workspaces/<str:namespace_id>/cutover",
        cutover_api.LedgerView.as_view(),
        name="internal-cutover-ledger",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/advance",
        cutover_api.AdvanceView.as_view(),
        name="internal-cutover-advance",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/rollback",
        cutover_api.RollbackView.as_view(),
        name="internal-cutover-rollback",
    ),
    path(
        "workspaces/<str:namespace_id>/cutover/recutover",
        cutover_api.RecutoverView.as_view(),
        name="internal-cutover-recutover",
    ),
    path("", include("upgrades.urls")),
]

urlpatterns = [
    path("health", health.health, name="health"),
    path("ready", health.ready, name="ready"),
    path("openapi.json", OpenApiView.as_view(), name="openapi"),
    path("admin/", admin.site.urls),
    path("v1/", include(v1)),
    path("internal/", include(internal_routes)),
]
