"""Annotations of the retrieval routes (retrieval tests, golden questions, queries and their
answers: ``retrieval.api``, ``retrieval.api.answers``) for the OpenAPI document
(:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema

from .common import (
    BOOLEAN,
    FILTERS,
    INTEGER,
    MODE,
    NOT_QUERYABLE,
    NULLABLE_OBJECT,
    OBJECT,
    SCORE_THRESHOLD,
    STRING,
    TOP_K,
    annotate,
    body,
    error,
    etag,
    if_match,
    page,
    page_parameters,
    shape,
)

RETRIEVAL_RESULT = {
    "mode": STRING,
    "items": {"type": "array", "items": OBJECT},
    "metrics": OBJECT,
    "plan": NULLABLE_OBJECT,
    "stages": {"type": "array", "items": OBJECT},
}
MODELS_DOWN = error(
    "`embedding_model_unavailable`, `rerank_unavailable`, `model_runtime_unavailable`, "
    "`search_backend_unavailable`."
)
GOLDEN = {
    "question": STRING,
    "expected_evidence": {"type": "array", "items": OBJECT},
    "tags": {"type": "array", "items": STRING},
    "metadata": OBJECT,
}


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    annotate(
        "retrieval.api.views.RetrievalTestView",
        post=extend_schema(
            summary="Run one retrieval and show its stages",
            request=body(
                "Left-out `top_k`, `mode`, `score_threshold` take the space's profile.",
                {
                    "query": {"type": "string", "minLength": 1, "maxLength": 16000},
                    "mode": {"type": "string", "enum": ["fast", "deep", "research"]},
                    "top_k": TOP_K,
                    "score_threshold": SCORE_THRESHOLD,
                    "filters": FILTERS,
                    "include_text": BOOLEAN,
                },
                ("query",),
            ),
            responses={
                200: shape("Ranked items, metrics, the plan and the stages.", RETRIEVAL_RESULT),
                409: error(NOT_QUERYABLE),
                503: MODELS_DOWN,
            },
        ),
    )
    annotate(
        "retrieval.api.views.GoldenQuestionListView",
        get=extend_schema(
            summary="The space's golden questions, newest first",
            parameters=page_parameters(20),
            responses={200: page("GoldenQuestionPage", "Golden questions.")},
        ),
        post=extend_schema(
            summary="Add a golden question",
            request=body("A question and the evidence it must find.", GOLDEN, ("question",)),
            parameters=[etag("question's `revision`")],
            responses={
                201: shape("The question.", {"id": STRING, "revision": INTEGER, **GOLDEN}),
                409: error("`golden_question_limit`."),
            },
        ),
    )
    question = shape("The question.", {"id": STRING, "revision": INTEGER, **GOLDEN})
    annotate(
        "retrieval.api.views.GoldenQuestionDetailView",
        get=extend_schema(
            summary="Read a golden question",
            parameters=[etag("question's `revision`")],
            responses={200: question},
        ),
        patch=extend_schema(
            summary="Replace members of a golden question",
            parameters=[if_match("question's `revision`", "revision_conflict")],
            request=body(
                "Members named replace the stored ones.",
                {**GOLDEN, "revision": {"type": "integer", "minimum": 1}},
            ),
            responses={200: question, 409: error("`revision_conflict`.")},
        ),
        delete=extend_schema(
            summary="Delete a golden question",
            responses={204: OpenApiResponse(description="Deleted.")},
        ),
    )
    annotate(
        "retrieval.api.answers.QueryView",
        post=extend_schema(
            summary="A cited answer, streamed as server-sent events",
            request=body(
                "The space, the question and optional retrieval settings.",
                {
                    "space_id": STRING,
                    "query": {"type": "string", "minLength": 1, "maxLength": 16000},
                    "mode": MODE,
                    "top_k": TOP_K,
                    "score_threshold": SCORE_THRESHOLD,
                    "filters": FILTERS,
                },
                ("space_id", "query"),
            ),
            parameters=[
                OpenApiParameter(
                    "X-Query-Run-Id",
                    str,
                    OpenApiParameter.HEADER,
                    response=[200],
                    description="The answer trace id (`GET /v1/queries/{trace_id}`).",
                )
            ],
            responses={
                (200, "text/event-stream"): OpenApiResponse(
                    {"type": "string"},
                    description=(
                        "`text/event-stream`: `answer.delta` events, then `answer.done` (the "
                        "answer, citations, answerability) or `answer.error`."
                    ),
                ),
                406: error("`not_acceptable`: `Accept` rules out the stream and JSON."),
                409: error(NOT_QUERYABLE),
                503: MODELS_DOWN,
            },
        ),
    )
    annotate(
        "retrieval.api.answers.QueryTraceView",
        get=extend_schema(
            summary="An answer's trace",
            responses={
                200: shape(
                    "Steps, evidence ids and answerability; never the prompt or answer text.",
                    {"id": STRING, "space_id": STRING, "steps": {"type": "array", "items": OBJECT}},
                )
            },
        ),
    )
