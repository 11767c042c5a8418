"""Explicit feedback on an answer (``POST /v1/queries/{trace_id}/feedback``) and reading the
failed queries of a space.

Feedback is accepted only on a trace the caller may read (:func:`retrieval.answers.get_trace`:
a foreign or unknown trace is 404 ``trace_not_found``). ``helpful: false`` records a
``user-feedback`` failed query with the caller's provenance; ``helpful: true`` records nothing.
The trace keeps only the query's SHA-256, so the row's text comes from the body's optional
``query`` (checked against the trace: 400 ``query_mismatch``) or from a failed query the answer
itself captured; without either the row has no text.
"""

from __future__ import annotations

import hashlib

from django.db import transaction

from knowledgefs.errors import InvalidInput
from retrieval.answers.traces import get_trace

from . import capture
from .models import FailedQuery
from .scope import one, provenance_of, readable

MAX_REASON = 2000
FEEDBACK_MEMBERS = ("helpful", "reason", "query")


def record_feedback(principal, trace_id, body) -> tuple[FailedQuery | None, bool]:
    """``(row, created)``: the failed query the feedback recorded (``None`` for helpful)."""
    trace = get_trace(principal, trace_id)
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(FEEDBACK_MEMBERS))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a feedback member (members: {', '.join(FEEDBACK_MEMBERS)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    helpful = body.get("helpful")
    if not isinstance(helpful, bool):
        raise InvalidInput(
            "helpful is required: true or false",
            code="invalid_feedback",
            details={"field": "helpful"},
        )
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise InvalidInput(
            f"reason must be a string of at most {MAX_REASON} characters",
            code="invalid_feedback",
            details={"field": "reason", "max": MAX_REASON},
        )
    query = body.get("query")
    if query is not None:
        if not isinstance(query, str) or (
            hashlib.sha256(query.encode()).hexdigest() != trace.query_sha256
        ):
            raise InvalidInput(
                "query is not the question this trace answered",
                code="query_mismatch",
                details={"field": "query"},
            )
    if helpful:
        return None, False
    if query is None:
        known = FailedQuery.objects.filter(trace_id=trace.id).exclude(query="").first()
        query = known.query if known else ""
    fields = {
        **provenance_of(principal),
        "space_id": trace.space_id,
        "trace_id": trace.id,
        "trigger": capture.USER_FEEDBACK,
        "query": query,
        "query_sha256": trace.query_sha256,
        "mode": trace.mode,
        "source": trace.source,
        "answerability": trace.answerability,
        "reason": reason,
    }
    with transaction.atomic():
        row, created = FailedQuery.objects.get_or_create(
            trace_id=trace.id, trigger=capture.USER_FEEDBACK, defaults=fields
        )
    return row, created


def failed_queries(principal, space, status: str | None = None):
    """The failed queries of ``space`` ``principal`` may read (a queryset; see
    :func:`retrieval.quality.scope.readable`), ``status`` one of
    :attr:`FailedQuery.STATUSES` (400 ``invalid_status``)."""
    rows = readable(principal, FailedQuery.objects.all(), space)
    if status is not None:
        if status not in FailedQuery.STATUSES:
            raise InvalidInput(
                f"status must be one of: {', '.join(FailedQuery.STATUSES)}",
                code="invalid_status",
                details={"field": "status"},
            )
        rows = rows.filter(status=status)
    return rows


def get_failed_query(principal, space, ident) -> FailedQuery:
    """One failed query, or 404 ``failed_query_not_found``."""
    return one(principal, FailedQuery, space, ident, "failed_query_not_found", "failed query")
