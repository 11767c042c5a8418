"""The ingestion REST API: document and job views (``views``) and their serializers
(``serializers``); the URL patterns are in :mod:`ingestion.urls`. The view classes are
re-exported here for the OpenAPI annotations that name them as ``ingestion.api.<View>``."""

from .views import (  # noqa: F401
    DocumentDetailView,
    DocumentListView,
    DocumentTextView,
    JobDetailView,
    JobListView,
    JobRetryView,
)
