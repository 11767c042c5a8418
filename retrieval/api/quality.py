"""REST views of the quality loop (docs/quality.md): answer feedback, failed queries and bad
cases. Thin wrappers over :mod:`retrieval.quality`."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import status as http
from rest_framework.response import Response

from knowledgefs.auth.operations import ADMIN_CALLERS, READ_CALLERS, Operation, child, space_from
from knowledgefs.pagination import NewestFirstPagination
from spaces.services import get_space

from ..quality import bad_cases, evidence_match, feedback, replay, trends, triage, triage_runs
from ..quality.scope import covers
from .views import RouteView


def _page(view, request, queryset) -> Response:
    """A newest-first page (``?limit=`` 1..200, default 50) of the rows the caller may read
    (a caller bound to several spaces may get fewer than ``limit`` per page)."""
    paginator = NewestFirstPagination(page_size=50)
    paginator.max_page_size = 200
    rows = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(
        [row.as_dict() for row in rows if covers(request.user, row)]
    )


class QueryFeedbackView(RouteView):
    """``POST /v1/queries/{trace_id}/feedback`` ``{helpful, reason?, query?}``."""

    operations = {
        "POST": Operation(
            "queries.feedback", child("query", "trace_id", parent_field=None), READ_CALLERS
        )
    }

    def post(self, request, trace_id):
        """201 with the failed query recorded (200 when it already was); ``helpful: true``
        records nothing (200, ``failed_query`` null)."""
        row, created = feedback.record_feedback(request.user, trace_id, request.data)
        body = {"trace_id": str(trace_id), "failed_query": row.as_dict() if row else None}
        return Response(body, status=http.HTTP_201_CREATED if created else http.HTTP_200_OK)


class FailedQueryListView(RouteView):
    operations = {"GET": Operation("failed_queries.list", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id):
        """``?status=&limit=&cursor=``: the space's failed queries the caller may read."""
        space = get_space(request.user, space_id)
        rows = feedback.failed_queries(request.user, space, request.query_params.get("status"))
        return _page(self, request, rows)


class FailedQueryDetailView(RouteView):
    operations = {
        "GET": Operation("failed_queries.read", space_from(), ADMIN_CALLERS),
        "PATCH": Operation("failed_queries.update", space_from(), ADMIN_CALLERS),
    }

    def get(self, request, space_id, failed_query_id):
        space = get_space(request.user, space_id)
        return Response(feedback.get_failed_query(request.user, space, failed_query_id).as_dict())

    def patch(self, request, space_id, failed_query_id):
        """Annotation ``{expected_revision, verdict, expected_evidence_ids?, note?}``."""
        space = get_space(request.user, space_id)
        row = feedback.get_failed_query(request.user, space, failed_query_id)
        return Response(triage.annotate(row, request.data).as_dict())


class FailedQueryTriageView(RouteView):
    operations = {"POST": Operation("failed_queries.triage", space_from(), ADMIN_CALLERS)}

    def post(self, request, space_id):
        """``{limit? 1–1000}``, header ``Idempotency-Key`` (8–255) → 202 with the queued triage
        run (poll it at ``…/failed-queries/triage-runs/{id}``)."""
        space = get_space(request.user, space_id)
        run, _created = triage_runs.create_run(
            request.user, space, request.data,
            idempotency_key=request.headers.get("Idempotency-Key"),
        )  # fmt: skip
        return Response(triage_runs.as_dict(run), status=http.HTTP_202_ACCEPTED)


class TriageRunListView(RouteView):
    operations = {"GET": Operation("failed_queries.triage_runs.list", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id):
        """``?state=&limit=(1..100)&cursor=``, newest first."""
        space = get_space(request.user, space_id)
        rows = triage_runs.runs(request.user, space, request.query_params)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(
            [triage_runs.as_dict(r) for r in page if covers(request.user, r)]
        )


class TriageRunCancelView(RouteView):
    operations = {
        "POST": Operation("failed_queries.triage_runs.cancel", space_from(), ADMIN_CALLERS)
    }

    def post(self, request, space_id, run_id):
        """``{expected_revision}`` → the canceled run (409 stale or finished)."""
        space = get_space(request.user, space_id)
        run = triage_runs.cancel_run(triage_runs.get_run(request.user, space, run_id), request.data)
        return Response(triage_runs.as_dict(run))


class TriageRunDetailView(RouteView):
    operations = {"GET": Operation("failed_queries.triage_runs.read", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id, run_id):
        space = get_space(request.user, space_id)
        return Response(triage_runs.as_dict(triage_runs.get_run(request.user, space, run_id)))


class FailedQueryClustersView(RouteView):
    operations = {"GET": Operation("failed_queries.clusters.list", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id):
        """``?limit= (1–1000, default 200)&status=``: paraphrase clusters, largest first."""
        space = get_space(request.user, space_id)
        rows = feedback.failed_queries(request.user, space, request.query_params.get("status"))
        return Response(triage.clusters(rows, request.query_params.get("limit")))


class FailedQueryMetricsView(RouteView):
    operations = {"GET": Operation("failed_queries.metrics.read", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id):
        space = get_space(request.user, space_id)
        return Response(triage.metrics(feedback.failed_queries(request.user, space)))


class BadCaseListView(RouteView):
    operations = {
        "GET": Operation("bad_cases.list", space_from(), ADMIN_CALLERS),
        "POST": Operation("bad_cases.create", space_from(), ADMIN_CALLERS),
    }

    def get(self, request, space_id):
        space = get_space(request.user, space_id)
        rows = bad_cases.bad_cases(request.user, space, request.query_params.get("status"))
        return _page(self, request, rows)

    def post(self, request, space_id):
        """``{trace_id, reason (1–4000), tags? (≤ 50)}`` → 201 with the bad case."""
        space = get_space(request.user, space_id)
        case = bad_cases.create_bad_case(request.user, space, request.data)
        return Response(case.as_dict(), status=http.HTTP_201_CREATED)


class BadCaseDetailView(RouteView):
    operations = {
        "GET": Operation("bad_cases.read", space_from(), ADMIN_CALLERS),
        "PATCH": Operation("bad_cases.update", space_from(), ADMIN_CALLERS),
    }

    def get(self, request, space_id, bad_case_id):
        space = get_space(request.user, space_id)
        return Response(bad_cases.get_bad_case(request.user, space, bad_case_id).as_dict())

    def patch(self, request, space_id, bad_case_id):
        """``{expected_revision, status?, reason?, replay_run_id?, tags?}``; stale → 409."""
        space = get_space(request.user, space_id)
        case = bad_cases.get_bad_case(request.user, space, bad_case_id)
        return Response(bad_cases.update_bad_case(request.user, case, request.data).as_dict())


class BadCaseHistoryView(RouteView):
    operations = {"GET": Operation("bad_cases.history.list", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id, bad_case_id):
        space = get_space(request.user, space_id)
        case = bad_cases.get_bad_case(request.user, space, bad_case_id)
        return Response({"results": bad_cases.history(case)})


class EvidenceMatchView(RouteView):
    operations = {
        "POST": Operation("golden_questions.evidence_matches.create", space_from(), ADMIN_CALLERS)
    }

    def post(self, request, space_id):
        """``{evidence_texts[1..500] | node_ids[1..50], minimum_similarity?, top_k?}``."""
        space = get_space(request.user, space_id)
        return Response(evidence_match.evidence_matches(space, request.data))


class GoldenBulkImportView(RouteView):
    operations = {
        "POST": Operation("golden_questions.bulk_import.create", space_from(), ADMIN_CALLERS)
    }

    def post(self, request, space_id):
        """``{rows[1..500]{question, evidence, tags?, metadata?}, match_policy?,
        minimum_similarity?}`` → 201 ``{active_count, draft_count, items}``."""
        space = get_space(request.user, space_id)
        result = evidence_match.bulk_import(space, request.data)
        return Response(result, status=http.HTTP_201_CREATED)


#: The largest replay-run response (4 MiB): beyond it the items are left out (``items_omitted``).
MAX_RUN_BYTES = 4 * 1024 * 1024


class ReplayRunListView(RouteView):
    operations = {
        "GET": Operation("replay_runs.list", space_from(), ADMIN_CALLERS),
        "POST": Operation("replay_runs.create", space_from(), ADMIN_CALLERS),
    }

    def get(self, request, space_id):
        """``?mode=&state=&from=&to=&limit=(1..100)&cursor=``, newest first, without items."""
        space = get_space(request.user, space_id)
        rows = replay.runs(request.user, space, request.query_params)
        assert isinstance(rows, QuerySet)  # replay.runs answers a queryset (annotated object)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(
            [replay.as_dict(r, items=False) for r in page if covers(request.user, r)]
        )

    def post(self, request, space_id):
        """``{golden_question_ids[1..1000] | selection: "all-active", mode?}``, header
        ``Idempotency-Key`` (8–255) → 202 with the queued run."""
        space = get_space(request.user, space_id)
        run, _created = replay.create_run(
            request.user, space, request.data,
            idempotency_key=request.headers.get("Idempotency-Key"),
        )  # fmt: skip
        return Response(_bounded(replay.as_dict(run)), status=http.HTTP_202_ACCEPTED)


def _bounded(body: dict) -> dict:
    import json

    if len(json.dumps(body, ensure_ascii=False).encode()) > MAX_RUN_BYTES:
        body["items_omitted"] = len(body.pop("items", []))
    return body


class ReplayRunDetailView(RouteView):
    operations = {"GET": Operation("replay_runs.read", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id, run_id):
        space = get_space(request.user, space_id)
        return Response(_bounded(replay.as_dict(replay.get_run(request.user, space, run_id))))


class ReplayRunCancelView(RouteView):
    operations = {"POST": Operation("replay_runs.cancel", space_from(), ADMIN_CALLERS)}

    def post(self, request, space_id, run_id):
        """``{expected_revision}`` → the canceled run (409 stale or finished)."""
        space = get_space(request.user, space_id)
        run = replay.cancel_run(replay.get_run(request.user, space, run_id), request.data)
        return Response(replay.as_dict(run, items=False))


class ReplayRunRetryView(RouteView):
    operations = {"POST": Operation("replay_runs.retry", space_from(), ADMIN_CALLERS)}

    def post(self, request, space_id, run_id):
        """``{expected_revision}`` → 202, the run queued again on a fresh snapshot."""
        space = get_space(request.user, space_id)
        run = replay.get_run(request.user, space, run_id)
        run = replay.retry_run(request.user, run, request.data)
        return Response(replay.as_dict(run, items=False), status=http.HTTP_202_ACCEPTED)


class QualityTrendsView(RouteView):
    operations = {"GET": Operation("quality.trends.read", space_from(), ADMIN_CALLERS)}

    def get(self, request, space_id):
        """``?window=24h|7d|30d (default 7d)&to=``: the current window against the one before."""
        space = get_space(request.user, space_id)
        return Response(trends.trends(request.user, space, request.query_params))
