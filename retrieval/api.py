"""REST view for retrieval tests: a thin wrapper over :func:`retrieval.services.retrieve`."""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.auth.operations import Operation, space_from
from knowledgefs.errors import InvalidInput
from spaces.services import get_space

from . import services


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
