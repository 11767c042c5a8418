"""URL patterns of the ingestion API (documents, their text and compilation jobs), included by
``knowledgefs/urls.py`` under ``/v1/``; the names are the ``reverse()`` names of the API."""

from django.urls import path

from .api.sources import SourceDetailView, SourceListView, SourceTestView
from .api.upload_sessions import (
    UploadSessionAbortView,
    UploadSessionCompleteView,
    UploadSessionDetailView,
    UploadSessionListView,
    UploadSessionSmallFileView,
)
from .api.views import (
    DocumentAssetView,
    DocumentDetailView,
    DocumentListView,
    DocumentRevisionListView,
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
        "knowledge-spaces/<str:space_id>/upload-sessions",
        UploadSessionListView.as_view(),
        name="upload-session-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/upload-sessions/<str:session_id>",
        UploadSessionDetailView.as_view(),
        name="upload-session-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/upload-sessions/<str:session_id>/small-file",
        UploadSessionSmallFileView.as_view(),
        name="upload-session-small-file",
    ),
    path(
        "knowledge-spaces/<str:space_id>/upload-sessions/<str:session_id>/complete",
        UploadSessionCompleteView.as_view(),
        name="upload-session-complete",
    ),
    path(
        "knowledge-spaces/<str:space_id>/upload-sessions/<str:session_id>/abort",
        UploadSessionAbortView.as_view(),
        name="upload-session-abort",
    ),
    path(
        "knowledge-spaces/<str:space_id>/documents/<str:document_id>/revisions",
        DocumentRevisionListView.as_view(),
        name="document-revisions",
    ),
    path(
        "knowledge-spaces/<str:space_id>/documents/<str:document_id>/assets/<str:asset_id>",
        DocumentAssetView.as_view(),
        name="document-asset",
    ),
    path(
        "knowledge-spaces/<str:space_id>/sources",
        SourceListView.as_view(),
        name="source-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/sources/<str:source_id>",
        SourceDetailView.as_view(),
        name="source-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/sources/<str:source_id>/test",
        SourceTestView.as_view(),
        name="source-test",
    ),
    path("knowledge-spaces/<str:space_id>/jobs", JobListView.as_view(), name="job-list"),
    path("jobs/<str:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/retry", JobRetryView.as_view(), name="job-retry"),
]
