"""URL map: the product API under ``/v1/``, Dify's internal routes under ``/internal/``,
probes, and Django admin."""

from django.contrib import admin
from django.urls import include, path

from retrieval.answer_api import QueryTraceView, QueryView
from retrieval.api import GoldenQuestionDetailView, GoldenQuestionListView, RetrievalTestView
from retrieval.research_tasks import api as research_task_api
from spaces.api import (
    EmbeddingProfileView,
    KnowledgeSpaceDetailView,
    KnowledgeSpaceListView,
    ProfileValidationView,
    RetrievalProfileView,
)

from . import health, internal
from .openapi.views import OpenApiView

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
    path(
        "knowledge-spaces/<str:space_id>/retrieval-tests",
        RetrievalTestView.as_view(),
        name="retrieval-test",
    ),
    # Answers: cited answers over SSE and their traces (docs/retrieval.md, "Answers").
    path("queries", QueryView.as_view(), name="query-create"),
    path("queries/<str:trace_id>", QueryTraceView.as_view(), name="query-trace"),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions",
        GoldenQuestionListView.as_view(),
        name="golden-question-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions/<str:question_id>",
        GoldenQuestionDetailView.as_view(),
        name="golden-question-detail",
    ),
    # Research tasks (docs/retrieval.md, "Research tasks").
    path(
        "research-tasks/plan",
        research_task_api.ResearchTaskPlanView.as_view(),
        name="research-task-plan",
    ),
    path("research-tasks", research_task_api.ResearchTaskListView.as_view(), name="research-tasks"),
    path(
        "research-tasks/<str:task_id>",
        research_task_api.ResearchTaskDetailView.as_view(),
        name="research-task-detail",
    ),
    path(
        "research-tasks/<str:task_id>/partials",
        research_task_api.ResearchTaskPartialsView.as_view(),
        name="research-task-partials",
    ),
    path(
        "research-tasks/<str:task_id>/resume",
        research_task_api.ResearchTaskResumeView.as_view(),
        name="research-task-resume",
    ),
    path(
        "knowledge-spaces/<str:space_id>/research-tasks",
        research_task_api.SpaceResearchTaskListView.as_view(),
        name="space-research-tasks",
    ),
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
]
