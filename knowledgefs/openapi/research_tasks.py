"""Annotations of the research-task routes (``retrieval.api.research_tasks``) for the OpenAPI
document (:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema

from .common import (
    FILTERS,
    IDEMPOTENCY_KEY,
    NOT_QUERYABLE,
    NULLABLE_OBJECT,
    OBJECT,
    REPLAYED,
    STRING,
    TOP_K,
    annotate,
    body,
    error,
    page,
    page_parameters,
    shape,
)

TASK_BODY = {
    "space_id": STRING,
    "query": STRING,
    "top_k": TOP_K,
    "filters": FILTERS,
    "limits": {**OBJECT, "description": "Budgets (model calls, time); see docs/retrieval.md."},
}
TASK = shape(
    "A research task: `id`, `space_id`, `status`, `stage`, `progress`, `error`, `result` "
    "(once completed).",
    {
        "id": STRING,
        "space_id": STRING,
        "query": STRING,
        "status": STRING,
        "stage": STRING,
        "progress": OBJECT,
        "error": NULLABLE_OBJECT,
        "result": NULLABLE_OBJECT,
    },
)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    prefix = "retrieval.api.research_tasks."
    annotate(
        prefix + "ResearchTaskPlanView",
        post=extend_schema(
            summary="Estimate a research task (nothing is created)",
            request=body("As for create.", TASK_BODY, ("space_id", "query")),
            responses={200: shape("The plan and its estimated cost."), 409: error(NOT_QUERYABLE)},
        ),
    )
    annotate(
        prefix + "ResearchTaskListView",
        post=extend_schema(
            summary="Queue a research task",
            request=body("The space, the question and budgets.", TASK_BODY, ("space_id", "query")),
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            responses={
                202: TASK,
                409: error(NOT_QUERYABLE),
                422: error("`research_limits_exceeded`, `idempotency_key_reused`."),
                429: error("`research_task_limit`, `rate_limited`."),
            },
        ),
    )
    annotate(
        prefix + "ResearchTaskDetailView",
        get=extend_schema(summary="Read a research task", responses={200: TASK}),
        delete=extend_schema(
            summary="Cancel a research task",
            responses={200: TASK, 409: error("`research_task_finished`.")},
        ),
    )
    annotate(
        prefix + "ResearchTaskPartialsView",
        get=extend_schema(
            summary="A task's partial evidence bundles, by sequence",
            parameters=page_parameters(25),
            responses={200: page("ResearchTaskPartialPage", "Partial evidence bundles.")},
        ),
    )
    annotate(
        prefix + "ResearchTaskResumeView",
        post=extend_schema(
            summary="Queue a failed or canceled task again from its checkpoint",
            request=None,
            responses={202: TASK, 409: error("The task is not failed or canceled.")},
        ),
    )
    annotate(
        prefix + "SpaceResearchTaskListView",
        get=extend_schema(
            summary="The space's research tasks, newest first",
            parameters=page_parameters(20),
            responses={200: page("ResearchTaskPage", "Research tasks (without results).")},
        ),
    )
