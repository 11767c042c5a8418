"""REST views for retrieval tests (a thin wrapper over :func:`retrieval.services.retrieve`) and
golden questions (:mod:`retrieval.golden`)."""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.auth.operations import WRITE_CALLERS, Operation, space_from
from knowledgefs.errors import InvalidInput
from spaces.api import NewestFirstPagination
from spaces.services import get_space

from . import golden, services


class RetrievalTestView(APIView):
    operations = {"POST": Operation("queries.create", space_from())}

    def post(self, request, space_id):
        """Body: ``{"query", "top_k" (1..100), "score_threshold", "mode"}``.

        ``score_threshold`` is ``null`` (off) or a number in [0, 1]. ``top_k``, ``mode`` and
        ``score_threshold`` left out take the space's retrieval profile (top_k 10, fast, off by
        default).
        """
        space = get_space(request.user, space_id)
        body = request.data
        if not hasattr(body, "get"):
            raise InvalidInput("body must be a JSON object", code="invalid_request")
        result = services.retrieve(
            space,
            body.get("query"),
            top_k=body.get("top_k"),
            score_threshold=body.get("score_threshold", services.PROFILE),
            mode=body.get("mode"),
        )
        return Response(result.as_dict())


class GoldenQuestionListView(APIView):
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


class GoldenQuestionDetailView(APIView):
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
