"""REST view for retrieval tests: a thin wrapper over :func:`retrieval.services.retrieve`."""

from __future__ import annotations

import json

from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.auth.operations import Operation, space_from
from knowledgefs.errors import InvalidInput
from spaces.services import get_space

from . import services

BODY_MEMBERS = ("query", "mode", "top_k", "score_threshold", "filters", "include_text")
#: The largest retrieval-test response body (inventory §3.4: 4 MiB).
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class RetrievalTestView(APIView):
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
        unknown = sorted(set(body) - set(BODY_MEMBERS))
        if unknown:
            raise InvalidInput(
                f"{unknown[0]}: not a retrieval-test member (members: {', '.join(BODY_MEMBERS)})",
                code="invalid_request",
                details={"field": unknown[0]},
            )
        mode = body.get("mode")
        if mode == "auto":
            raise InvalidInput(
                "mode: auto is not available in retrieval tests (a test runs one concrete "
                f"mode); use one of: {', '.join(services.CONCRETE_MODES)}",
                code="mode_unavailable",
                details={"field": "mode", "supported": list(services.CONCRETE_MODES)},
            )
        include_text = body.get("include_text", True)
        if not isinstance(include_text, bool):
            raise InvalidInput(
                "include_text must be true or false",
                code="invalid_request",
                details={"field": "include_text"},
            )
        result = services.retrieve(
            space,
            body.get("query"),
            top_k=body.get("top_k"),
            score_threshold=body.get("score_threshold", services.PROFILE),
            mode=mode,
            filters=body.get("filters"),
        )
        payload = result.as_dict()
        if not include_text:
            for item in payload["items"]:
                item.pop("text", None)
        return Response(bounded(payload))


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
