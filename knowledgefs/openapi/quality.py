"""Annotations of the quality-loop routes (``retrieval.api.quality``) for the OpenAPI document
(:mod:`knowledgefs.openapi.common`; docs/quality.md)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema

from .common import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    annotate,
    body,
    error,
    page,
    page_parameters,
    shape,
)

STRINGS = {"type": "array", "items": STRING}
FAILED_QUERY = shape(
    "A failed query: `id`, `trace_id`, `trigger`, `status`, `query`, `confidence`, "
    "`provenance`, `revision`."
)
BAD_CASE = shape("A bad case: `id`, `trace_id`, `status`, `reason`, `tags`, `revision`.")
RUN = shape(
    "A replay run: `id`, `mode`, `state`, `attempt`, `revision`, `error`, `summary`, "
    "`provenance`, `items` (each with `result.evidence_diff` and `metrics`)."
)
TRIAGE_RUN = shape(
    "A triage run: `id`, `state` (queued, running, succeeded, failed, canceled), `attempt`, "
    "`revision`, `limit`, `summary` (`triaged`, `verdicts`), `attempt_count`, `error`, "
    "`requester`."
)
REVISION = body(
    "The run's current revision.", {"expected_revision": INTEGER}, ("expected_revision",)
)
RUN_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description="8-255 characters: the same key and request answer the same run; another "
    "request under the key is 409 `idempotency_key_reused`.",
)
STATUS = OpenApiParameter("status", str, OpenApiParameter.QUERY, description="Filter by status.")


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    p = "retrieval.api.quality."
    annotate(
        p + "QueryFeedbackView",
        post=extend_schema(
            summary="Feedback on an answer",
            request=body(
                "`helpful: false` records a failed query.",
                {"helpful": BOOLEAN, "reason": STRING, "query": STRING},
                ("helpful",),
            ),
            responses={
                201: shape("The failed query recorded."),
                200: shape("Recorded before, or helpful."),
                400: error("`invalid_feedback`, `query_mismatch`."),
                404: error("`trace_not_found`."),
            },
        ),  # fmt: skip
    )
    annotate(
        p + "FailedQueryListView",
        get=extend_schema(
            summary="The space's failed queries the caller's scope covers, newest first",
            parameters=[STATUS, *page_parameters(50)],
            responses={200: page("FailedQueryPage", "Failed queries.")},
        ),
    )
    annotate(
        p + "FailedQueryDetailView",
        get=extend_schema(summary="Read a failed query", responses={200: FAILED_QUERY}),
        patch=extend_schema(
            summary="Annotate a failed query (compare-and-set); a retrieval miss is promoted",
            request=body("The verdict and, for a retrieval miss, the chunks that answer.",
                         {"expected_revision": INTEGER, "verdict": STRING,
                          "expected_evidence_ids": STRINGS, "note": STRING},
                         ("expected_revision", "verdict")),
            responses={200: FAILED_QUERY,
                       409: error("`revision_conflict`, `failed_query_closed`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "FailedQueryTriageView",
        post=extend_schema(
            summary="Start a durable triage of pending failed queries (independent signals)",
            request=body("At most this many rows, 1-1000 (default 1000).", {"limit": INTEGER}),
            parameters=[RUN_KEY],
            responses={202: TRIAGE_RUN, 409: error("`idempotency_key_reused`.")},
        ),
    )
    annotate(
        p + "TriageRunListView",
        get=extend_schema(
            summary="The space's triage runs, newest first",
            parameters=[OpenApiParameter("state", str, OpenApiParameter.QUERY),
                        *page_parameters(20)],
            responses={200: page("TriageRunPage", "Triage runs.")},
        ),
    )  # fmt: skip
    annotate(
        p + "TriageRunCancelView",
        post=extend_schema(summary="Cancel a triage run", request=REVISION,
                           responses={200: TRIAGE_RUN, 409: error("`revision_conflict`, "
                                                                  "`triage_run_finished`.")}),
    )  # fmt: skip
    annotate(p + "TriageRunDetailView", get=extend_schema(summary="Read a triage run",
                                                         responses={200: TRIAGE_RUN}))  # fmt: skip
    annotate(
        p + "FailedQueryClustersView",
        get=extend_schema(
            summary="Paraphrase clusters of failed queries, largest first",
            parameters=[STATUS, OpenApiParameter("limit", int, OpenApiParameter.QUERY)],
            responses={200: shape("`clusters[{cluster_key, count, failed_query_ids, "
                                  "representative}]`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "FailedQueryMetricsView",
        get=extend_schema(
            summary="Failed-query metrics",
            responses={200: shape("`total`, `promotion_rate`, `by_status`, `by_trigger`.")},
        ),
    )
    annotate(
        p + "BadCaseListView",
        get=extend_schema(
            summary="The space's bad cases, newest first",
            parameters=[STATUS, *page_parameters(50)],
            responses={200: page("BadCasePage", "Bad cases.")},
        ),
        post=extend_schema(
            summary="Make a bad case of an answer trace",
            request=body(
                "The trace and why it is wrong.",
                {"trace_id": STRING, "reason": STRING, "tags": STRINGS},
                ("trace_id", "reason"),
            ),
            responses={201: BAD_CASE, 404: error("`trace_not_found`.")},
        ),  # fmt: skip
    )
    annotate(
        p + "BadCaseDetailView",
        get=extend_schema(summary="Read a bad case", responses={200: BAD_CASE}),
        patch=extend_schema(
            summary="Change a bad case (compare-and-set)",
            request=body(
                "Members to change.",
                {
                    "expected_revision": INTEGER,
                    "status": STRING,
                    "reason": STRING,
                    "replay_run_id": STRING,
                    "tags": STRINGS,
                },
                ("expected_revision",),
            ),
            responses={200: BAD_CASE, 409: error("`revision_conflict`.")},
        ),  # fmt: skip
    )
    annotate(
        p + "BadCaseHistoryView",
        get=extend_schema(summary="A bad case's immutable history", responses={200: shape("")}),
    )
    annotate(
        p + "EvidenceMatchView",
        post=extend_schema(
            summary="Match evidence texts or node ids to the space's chunks",
            request=body(
                "Exactly one of `evidence_texts` (≤ 500) or `node_ids` (≤ 50).",
                {
                    "evidence_texts": STRINGS,
                    "node_ids": STRINGS,
                    "minimum_similarity": NUMBER,
                    "top_k": INTEGER,
                },
            ),
            responses={
                200: shape("`items[{matched, candidates}]`."),
                503: error("`evidence_matching_unavailable`."),
            },
        ),  # fmt: skip
    )
    annotate(
        p + "GoldenBulkImportView",
        post=extend_schema(
            summary="Import golden questions in bulk (≤ 500 rows)",
            request=body(
                "Rows, match policy, minimum similarity.",
                {
                    "rows": {"type": "array", "items": OBJECT},
                    "match_policy": STRING,
                    "minimum_similarity": NUMBER,
                },
                ("rows",),
            ),
            responses={
                201: shape("`active_count`, `draft_count`, `items`."),
                409: error("`golden_question_limit`."),
            },
        ),  # fmt: skip
    )
    annotate(
        p + "ReplayRunListView",
        get=extend_schema(
            summary="The space's replay runs, newest first",
            parameters=[
                *(OpenApiParameter(n, str, OpenApiParameter.QUERY) for n in
                  ("mode", "state", "from", "to")),
                *page_parameters(20),
            ],
            responses={200: page("ReplayRunPage", "Replay runs (without items).")},
        ),
        post=extend_schema(
            summary="Start a durable replay of golden questions",
            request=body("`golden_question_ids` (≤ 1000) or `selection: all-active`.",
                         {"golden_question_ids": STRINGS, "selection": STRING, "mode": STRING}),
            parameters=[RUN_KEY],
            responses={202: RUN, 409: error("`idempotency_key_reused`."),
                       503: error("`replay_unavailable`.")},
        ),
    )  # fmt: skip
    annotate(p + "ReplayRunDetailView", get=extend_schema(summary="Read a replay run",
                                                          responses={200: RUN}))  # fmt: skip
    annotate(
        p + "ReplayRunCancelView",
        post=extend_schema(summary="Cancel a replay run", request=REVISION,
                           responses={200: RUN, 409: error("`revision_conflict`, "
                                                           "`replay_run_finished`.")}),
    )  # fmt: skip
    annotate(
        p + "ReplayRunRetryView",
        post=extend_schema(summary="Replay a finished run again on a fresh snapshot",
                           request=REVISION,
                           responses={202: RUN, 409: error("`revision_conflict`, "
                                                           "`replay_run_active`.")}),
    )  # fmt: skip
    annotate(
        p + "QualityTrendsView",
        get=extend_schema(
            summary="Quality trends: pass rate against a baseline, failed queries, bad cases",
            parameters=[OpenApiParameter("window", str, OpenApiParameter.QUERY,
                                         enum=["24h", "7d", "30d"]),
                        OpenApiParameter("to", str, OpenApiParameter.QUERY)],
            responses={200: shape("`baseline`, `current`, `slices`, `top_unanswered`, `daily`.")},
        ),
    )  # fmt: skip
