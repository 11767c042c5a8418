"""URL map: the product API under ``/v1/``, Dify's internal routes under ``/internal/``,
probes, and Django admin."""

from django.contrib import admin
from django.urls import include, path

from ingestion.api import (
    DocumentDetailView,
    DocumentListView,
    DocumentTextView,
    JobDetailView,
    JobListView,
    JobRetryView,
)
from retrieval.answer_api import QueryTraceView, QueryView
from retrieval.api import GoldenQuestionDetailView, GoldenQuestionListView, RetrievalTestView
from retrieval.research_tasks import api as research_task_api
from spaces import urls as spaces_urls
from upgrades import cutover_api

from . import health, internal
from .openapi.views import OpenApiView

handler400 = "knowledgefs.errors.handler400"
handler403 = "knowledgefs.errors.handler403"
handler404 = "knowledgefs.errors.handler404"
handler500 = "knowledgefs.errors.handler500"

v1 = [
    path("", include(spaces_urls.urlpatterns)),
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
    path("knowledge-spaces/<str:space_id>/jobs", JobListView.as_view(), name="job-list"),
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
    path("jobs/<str:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<str:job_id>/retry", JobRetryView.as_view(), name="job-retry"),
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
    path("", include(spaces_urls.internal_urlpatterns)),
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
