"""The spaces app's HTTP API: the product views (:mod:`.views`), their serializers and Dify's
internal views (:mod:`.internal`); routed by spaces/urls.py."""

from .views import (  # noqa: F401  (re-exports for knowledgefs/openapi/routes.py and the apps)
    EmbeddingProfileView,
    KnowledgeSpaceDetailView,
    KnowledgeSpaceListView,
    NewestFirstPagination,
    ProfileValidationView,
    RetrievalProfileView,
)
