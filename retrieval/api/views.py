"""REST views for retrieval tests (a thin wrapper over :func:`retrieval.modes.retrieve`) and
golden questions (:mod:`retrieval.golden`)."""

from __future__ import annotations

import json

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.auth.operations import WRITE_CALLERS, Operation, space_from
from knowledgefs.errors import InvalidInput
from knowledgefs.pagination import NewestFirstPagination
from spaces.services import get_space

from .. import golden
from ..modes import PROFILE, retrieve
from ..recall import CONCRETE_MODES

BODY_MEMBERS = (
    "query",
    "mode",
    "top_k",
    "score_threshold",
    "filters",
    "include_text",
    "query_images",
)


class RouteView(APIView):
    """Base of the retrieval routes: OPTIONS is not served (405 like any other method the
    route does not serve), so it is left out of the ``Allow`` header too (RFC 9110 §10.2.1:
    ``Allow`` lists the methods the resource supports)."""

    http_method_names = [m for m in APIView.http_method_names if m != "options"]


def refuse_unknown_members(body: dict, members: tuple[str, ...], what: str) -> None:
    """400 ``invalid_request`` naming the first member of ``body`` not in ``members`` (a typo
    such as ``"filter"`` must not run a wider request than asked); ``what`` names the body in
    the message (``"retrieval-test"``, ``"query"``, ``"research-task"``)."""
    unknown = sorted(set(body) - set(members))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a {what} member (members: {', '.join(members)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )


#: The largest retrieval-test response body (inventory §3.4: 4 MiB).
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class RetrievalTestView(RouteView):
    operations = {"POST": Operation("queries.create", space_from())}

    def post(self, request, space_id):
        """Body: ``{"query", "mode"?, "top_k"? (1..100), "score_threshold"?, "filters"?,
        "include_text"? (true)}``.

        ``mode`` is ``fast``, ``deep`` or ``research``; ``auto`` is refused (400
        ``mode_unavailable``: a test runs one concrete mode). ``score_threshold`` is ``null``
        (off) or a number in [0, 1]. ``top_k``, ``mode`` and ``score_threshold`` left out take
        the space's retrieval profile (10, fast, off by default). ``filters``:
        :mod:`retrieval.filters`. Response: ``{mode, items, metrics, plan, stages}``, at most
        4 MiB (:func:`bounded`).
        """
        space = get_space(request.user, space_id)
        body = request.data
        if not isinstance(body, dict):
            raise InvalidInput("body must be a JSON object", code="invalid_request")
        refuse_unknown_members(body, BODY_MEMBERS, "retrieval-test")
        mode = body.get("mode")
        if mode == "auto":
            raise InvalidInput(
                "mode: auto is not available in retrieval tests (a test runs one concrete "
                f"mode); use one of: {', '.join(CONCRETE_MODES)}",
                code="mode_unavailable",
                details={"field": "mode", "supported": list(CONCRETE_MODES)},
            )
        if mode is not None and mode not in CONCRETE_MODES:
            raise InvalidInput(
                f"mode must be one of: {', '.join(CONCRETE_MODES)}",
                code="invalid_mode",
                details={"field": "mode"},
            )
        include_text = body.get("include_text", True)
        if not isinstance(include_text, bool):
            raise InvalidInput(
                "include_text must be true or false",
                code="invalid_request",
                details={"field": "include_text"},
            )
        result = retrieve(
            space,
            body.get("query"),
            top_k=body.get("top_k"),
            score_threshold=body.get("score_threshold", PROFILE),
            mode=mode,
            filters=body.get("filters"),
            query_images=body.get("query_images"),
            subject=caller_subject(request.user),
        )
        payload = result.as_dict()
        if not include_text:
            for item in payload["items"]:
                item.pop("text", None)
        return Response(bounded(payload))


def caller_subject(principal) -> str:
    """Who Dify checks a query image's ownership against: the acting subject of a capability
    token, else the API key."""
    if getattr(principal, "subject", ""):
        return principal.subject
    key = getattr(principal, "api_key_id", None)
    return f"api-key:{key}" if key else ""


def bounded(payload: dict, limit: int = MAX_RESPONSE_BYTES) -> dict:
    """Keep a response within ``limit`` bytes of JSON (UTF-8) by dropping items from the end.

    The lowest-ranked items go first; ``metrics.response_truncated_items`` says how many were
    dropped (absent when none was). A response of no items always fits.
    """
    size = len(json.dumps(payload, ensure_ascii=False).encode())
    dropped = 0
    items = payload["items"]
    while size > limit and items:
        last = items.pop()
        size -= len(json.dumps(last, ensure_ascii=False).encode()) + 2
        dropped += 1
    if dropped:
        payload["metrics"]["response_truncated_items"] = dropped
    return payload


class GoldenQuestionListView(RouteView):
    """``GET/POST /v1/knowledge-spaces/{id}/golden-questions`` (:mod:`retrieval.golden`)."""

    operations = {
        "GET": Operation("golden_questions.list", space_from()),
        "POST": Operation("golden_questions.create", space_from(), WRITE_CALLERS),
    }

    def get(self, request, space_id):
        """A page of the space's questions, newest first (``?limit=`` 1..100, default 20)."""
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(golden.questions_in(space), request, view=self)
        return paginator.get_paginated_response([golden.as_dict(q) for q in page])

    def post(self, request, space_id):
        """Body ``{"question", "expected_evidence", "tags"?, "metadata"?}`` → 201 with the
        question and its ``ETag`` (the revision)."""
        space = get_space(request.user, space_id)
        question = golden.create_question(space, request.data)
        return Response(
            golden.as_dict(question), status=status.HTTP_201_CREATED, headers=_etag(question)
        )


class GoldenQuestionDetailView(RouteView):
    """``GET/PATCH/DELETE /v1/knowledge-spaces/{id}/golden-questions/{question_id}``."""

    operations = {
        "GET": Operation("golden_questions.read", space_from()),
        "PATCH": Operation("golden_questions.update", space_from(), WRITE_CALLERS),
        "DELETE": Operation("golden_questions.delete", space_from(), WRITE_CALLERS),
    }

    def get(self, request, space_id, question_id):
        question = golden.get_question(request.user, space_id, question_id)
        return Response(golden.as_dict(question), headers=_etag(question))

    def patch(self, request, space_id, question_id):
        """Members named replace the stored ones; ``If-Match: "N"`` (or the body's
        ``revision``) makes it a compare-and-set (409 ``revision_conflict``)."""
        question = golden.get_question(request.user, space_id, question_id)
        question = golden.update_question(
            question, request.data, expected_revision=_if_match(request)
        )
        return Response(golden.as_dict(question), headers=_etag(question))

    def delete(self, request, space_id, question_id):
        golden.delete_question(golden.get_question(request.user, space_id, question_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _etag(question) -> dict:
    return {"ETag": f'"{question.revision}"'}


def _if_match(request):
    """``If-Match: "N"`` as an int; absent → ``None``; malformed → 400 ``invalid_revision``."""
    header = request.headers.get("If-Match", "").strip()
    if not header:
        return None
    raw = header.removeprefix("W/").strip('"')
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise InvalidInput(
            'If-Match must be the question\'s revision, e.g. "3"', code="invalid_revision"
        )
    return int(raw)
