"""URL patterns of the ingestion API (documents, their text and compilation jobs), included by
``knowledgefs/urls.py`` under ``/v1/``; the names are the ``reverse()`` names of the API."""

from django.urls import path

from .api.views import (
    DocumentAssetView,
    DocumentDetailView,
    DocumentListView,
    DocumentTextView,
    JobDetailView,
    JobListView,
    JobRetryView,
)

urlpatterns = [
    path(
        "knowledge-spaces/<str:space_id>/documents",
        DocumentListView.as_view(),
        name="document-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/documents/<str:document_id>",
        DocumentDetailView.as_view(),
        name="document-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/documents/<str:document_id>/text",
        DocumentTextView.as_view(),
        name="document-text",
    ),
    path(
        "knowledge-spaces/<str:space_id>/documents/<str:document_id>/assets/<str:asset_id>",
        DocumentAssetView.as_view(),
        name="document-asset",
    ),
    path("knowledge-spaces/<str:space_id>/jobs", JobListView.as_view(), name="job-list"),
    path("jobs/<str:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/retry", JobRetryView.as_view(), name="job-retry"),
]
