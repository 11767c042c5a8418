"""Retrieval's product routes, included under ``/v1/`` by knowledgefs.urls: retrieval tests,
golden questions, cited answers, research tasks and the knowledge filesystem."""

from django.urls import path

from .api import fs, quality, research_tasks
from .api.answers import QueryTraceView, QueryView
from .api.views import GoldenQuestionDetailView, GoldenQuestionListView, RetrievalTestView

urlpatterns = [
    path(
        "knowledge-spaces/<str:space_id>/retrieval-tests",
        RetrievalTestView.as_view(),
        name="retrieval-test",
    ),
    # Answers: cited answers over SSE and their traces (docs/retrieval.md, "Answers").
    path("queries", QueryView.as_view(), name="query-create"),
    path("queries/<str:trace_id>", QueryTraceView.as_view(), name="query-trace"),
    # The quality loop (docs/quality.md).
    path(
        "queries/<str:trace_id>/feedback",
        quality.QueryFeedbackView.as_view(),
        name="query-feedback",
    ),
    path(
        "knowledge-spaces/<str:space_id>/failed-queries",
        quality.FailedQueryListView.as_view(),
        name="failed-query-list",
    ),
    *[
        path(
            f"knowledge-spaces/<str:space_id>/failed-queries/{name}",
            view.as_view(),
            name=f"failed-query-{name}",
        )
        for name, view in (
            ("triage", quality.FailedQueryTriageView),
            ("clusters", quality.FailedQueryClustersView),
            ("metrics", quality.FailedQueryMetricsView),
        )
    ],  # fmt: skip
    path(
        "knowledge-spaces/<str:space_id>/failed-queries/triage-runs",
        quality.TriageRunListView.as_view(),
        name="failed-query-triage-run-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/failed-queries/triage-runs/<str:run_id>",
        quality.TriageRunDetailView.as_view(),
        name="failed-query-triage-run",
    ),
    path(
        "knowledge-spaces/<str:space_id>/failed-queries/triage-runs/<str:run_id>/cancel",
        quality.TriageRunCancelView.as_view(),
        name="failed-query-triage-run-cancel",
    ),
    path(
        "knowledge-spaces/<str:space_id>/failed-queries/<str:failed_query_id>",
        quality.FailedQueryDetailView.as_view(),
        name="failed-query-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/bad-cases",
        quality.BadCaseListView.as_view(),
        name="bad-case-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/bad-cases/<str:bad_case_id>",
        quality.BadCaseDetailView.as_view(),
        name="bad-case-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/trends",
        quality.QualityTrendsView.as_view(),
        name="quality-trends",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/replay-runs",
        quality.ReplayRunListView.as_view(),
        name="replay-run-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/replay-runs/<str:run_id>",
        quality.ReplayRunDetailView.as_view(),
        name="replay-run-detail",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/replay-runs/<str:run_id>/cancel",
        quality.ReplayRunCancelView.as_view(),
        name="replay-run-cancel",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/replay-runs/<str:run_id>/retry",
        quality.ReplayRunRetryView.as_view(),
        name="replay-run-retry",
    ),
    path(
        "knowledge-spaces/<str:space_id>/quality/bad-cases/<str:bad_case_id>/history",
        quality.BadCaseHistoryView.as_view(),
        name="bad-case-history",
    ),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions",
        GoldenQuestionListView.as_view(),
        name="golden-question-list",
    ),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions/evidence-matches",
        quality.EvidenceMatchView.as_view(),
        name="golden-question-evidence-matches",
    ),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions/bulk-import",
        quality.GoldenBulkImportView.as_view(),
        name="golden-question-bulk-import",
    ),
    path(
        "knowledge-spaces/<str:space_id>/golden-questions/<str:question_id>",
        GoldenQuestionDetailView.as_view(),
        name="golden-question-detail",
    ),
    # Research tasks (docs/retrieval.md, "Research tasks").
    path(
        "research-tasks/plan",
        research_tasks.ResearchTaskPlanView.as_view(),
        name="research-task-plan",
    ),
    path("research-tasks", research_tasks.ResearchTaskListView.as_view(), name="research-tasks"),
    path(
        "research-tasks/<str:task_id>",
        research_tasks.ResearchTaskDetailView.as_view(),
        name="research-task-detail",
    ),
    path(
        "research-tasks/<str:task_id>/partials",
        research_tasks.ResearchTaskPartialsView.as_view(),
        name="research-task-partials",
    ),
    path(
        "research-tasks/<str:task_id>/resume",
        research_tasks.ResearchTaskResumeView.as_view(),
        name="research-task-resume",
    ),
    path(
        "knowledge-spaces/<str:space_id>/research-tasks",
        research_tasks.SpaceResearchTaskListView.as_view(),
        name="space-research-tasks",
    ),
    # The knowledge filesystem (docs/filesystem.md): one operation per route.
    *[
        path(f"knowledge-spaces/<str:space_id>/fs/{name}", view.as_view(), name=f"fs-{name}")
        for name, view in (
            ("ls", fs.FsLsView),
            ("tree", fs.FsTreeView),
            ("cat", fs.FsCatView),
            ("stat", fs.FsStatView),
            ("grep", fs.FsGrepView),
            ("find", fs.FsFindView),
            ("diff", fs.FsDiffView),
            ("open_node", fs.FsOpenNodeView),
        )
    ],
    path(
        "knowledge-spaces/<str:space_id>/fs/shell/plan",
        fs.ShellPlanView.as_view(),
        name="fs-shell-plan",
    ),
    path(
        "knowledge-spaces/<str:space_id>/fs/shell/execute",
        fs.ShellExecuteView.as_view(),
        name="fs-shell-execute",
    ),
]
