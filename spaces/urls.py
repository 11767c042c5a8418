"""The spaces app's routes, included by knowledgefs/urls.py: ``urlpatterns`` under ``/v1/``,
``internal_urlpatterns`` (Dify's, inner API key only) under ``/internal/``."""

from django.urls import path

from .api import internal, views

urlpatterns = [
    path("knowledge-spaces", views.KnowledgeSpaceListView.as_view(), name="space-list"),
    path(
        "knowledge-spaces/<str:space_id>",
        views.KnowledgeSpaceDetailView.as_view(),
        name="space-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/embedding-profile",
        views.EmbeddingProfileView.as_view(),
        name="space-embedding-profile",
    ),
    path(
        "knowledge-spaces/<str:space_id>/retrieval-profile",
        views.RetrievalProfileView.as_view(),
        name="space-retrieval-profile",
    ),
    path(
        "knowledge-spaces/<str:space_id>/profile-validation",
        views.ProfileValidationView.as_view(),
        name="space-profile-validation",
    ),
]

internal_urlpatterns = [
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
]
