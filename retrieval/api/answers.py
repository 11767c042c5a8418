"""REST views for answers: ``POST /v1/queries`` (SSE) and ``GET /v1/queries/{trace_id}``.

Thin wrappers over :mod:`retrieval.answers`. Authentication, permission and throttling run in
DRF's ``initial()`` before the view; every refusal before the stream (bad body, unknown space,
a space not ready, an embedding model down) is an ordinary JSON error. The stream itself is a
:class:`~django.http.StreamingHttpResponse`, so it works under gunicorn's sync workers (the
worker writes each event as the generator yields it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.exceptions import NotAcceptable
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.mediatypes import media_type_matches

from knowledgefs.auth.operations import Operation, child, space_from
from knowledgefs.errors import InvalidInput, ServiceError
from spaces.services import get_space

from .. import answers
from ..modes import PROFILE
from ..recall import BLANK_QUERY, MODES
from ..text import is_blank
from .views import RouteView, caller_subject, refuse_unknown_members

QUERY_MEMBERS = (
    "space_id",
    "query",
    "mode",
    "top_k",
    "filters",
    "score_threshold",
    "query_images",
)
# What the route produces: the stream on success, JSON for every refusal before it.
PRODUCES = ("text/event-stream", "application/json")


def parse_body(body) -> dict:
    """Check the shape of a ``POST /v1/queries`` body; returns ``{space_id, query, mode, top_k,
    score_threshold, filters}`` (left-out values ``None``, ``score_threshold`` :data:`PROFILE`).

    400 ``invalid_request`` (not an object), ``invalid_space_id`` (missing or not a string),
    ``invalid_query`` (not a string of 1–16,000 characters), ``invalid_mode``; ``top_k`` and
    ``score_threshold`` are checked by :func:`retrieval.modes.retrieve` (``invalid_top_k``,
    ``invalid_score_threshold``).
    """
    if not hasattr(body, "get"):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    space_id = body.get("space_id")
    if not isinstance(space_id, str) or not space_id.strip():
        raise InvalidInput("space_id is required (a knowledge space id)", code="invalid_space_id")
    query = body.get("query")
    images = body.get("query_images")
    if images and query is None:
        query = ""  # an image-only query
    if not isinstance(query, str) or (is_blank(query) and not images):
        raise InvalidInput(
            BLANK_QUERY + " (or send at least one of query_images)",
            code="invalid_query",
            details={"field": "query"},
        )
    if len(query) > settings.RETRIEVAL_MAX_QUERY_CHARS:
        raise InvalidInput(
            f"query is {len(query)} characters; the limit is {settings.RETRIEVAL_MAX_QUERY_CHARS}",
            code="invalid_query",
        )
    mode = body.get("mode")
    if mode is not None and mode not in MODES:
        raise InvalidInput(f"mode must be one of: {', '.join(MODES)}", code="invalid_mode")
    return {
        "space_id": space_id,
        "query": query,
        "mode": mode,
        "top_k": body.get("top_k"),
        "score_threshold": body.get("score_threshold", PROFILE),
        "filters": body.get("filters"),
        "query_images": images,
    }


def sse(run: answers.AnswerRun) -> Iterator[bytes]:
    """:func:`retrieval.answers.events` as ``text/event-stream`` bytes (``event:`` and one
    ``data:`` JSON line); a heartbeat is the comment line ``: heartbeat``."""
    stream = answers.events(run)
    try:
        for name, payload in stream:
            if name == answers.HEARTBEAT:
                yield b": heartbeat\n\n"  # a comment: clients ignore it, proxies see traffic
                continue
            data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
            yield f"event: {name}\ndata: {data}\n\n".encode()
    finally:
        stream.close()  # a client that went away completes the trace now


class QueryView(RouteView):
    operations = {"POST": Operation("queries.answer", space_from("body"))}

    def perform_content_negotiation(self, request, force=False):
        """Accept any header that admits the stream or the JSON errors (``text/event-stream``,
        ``text/*``, ``application/json``, ``*/*``, none): refusals are always rendered as JSON,
        the stream needs no renderer. Anything else (``Accept: image/png``) is 406."""
        renderer = JSONRenderer()
        accept = request.META.get("HTTP_ACCEPT", "").strip()
        ranges = [part.strip() for part in accept.split(",") if part.strip()]
        if (
            force
            or not ranges
            or any(
                media_type_matches(produced, wanted) for produced in PRODUCES for wanted in ranges
            )
        ):
            return renderer, renderer.media_type
        raise NotAcceptable()

    def post(self, request):
        """Body ``{space_id, query (1–16,000 chars), mode?, top_k?, filters?,
        score_threshold?}`` → ``text/event-stream`` of ``answer.delta``… ``answer.done`` |
        ``answer.error``; header ``X-Query-Run-Id`` (the answer trace id)."""
        if isinstance(request.data, dict):
            refuse_unknown_members(request.data, QUERY_MEMBERS, "query")
        params = parse_body(request.data)
        space = get_space(request.user, params["space_id"])
        try:
            run = answers.start(
                answers.Requester.of(request.user),
                space,
                params["query"],
                mode=params["mode"],
                top_k=params["top_k"],
                score_threshold=params["score_threshold"],
                filters=params["filters"],
                source="service_api",
                query_images=params["query_images"],
                subject=caller_subject(request.user),
            )
        except ServiceError as exc:
            trace_id = getattr(exc, "trace_id", None)
            headers = {**getattr(exc, "headers", {})}
            if trace_id:
                headers["X-Query-Run-Id"] = trace_id
            return Response(exc.as_dict(), status=exc.status, headers=headers)
        response = StreamingHttpResponse(sse(run), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the events
        # A compressing middleware (Django's GZipMiddleware) would buffer the events in its
        # compressor: it compresses only for a request that accepts gzip, so this one no longer
        # does. The stream goes out as written, with no Content-Encoding.
        request._request.META.pop("HTTP_ACCEPT_ENCODING", None)
        response["X-Query-Run-Id"] = run.trace_id
        return response


class QueryTraceView(RouteView):
    # /v1/queries/{trace_id} does not name the space: the token's parent_id scopes nothing here;
    # the trace's tenant, the caller's spaces and (for tokens) its subject do.
    operations = {"GET": Operation("queries.read", child("query", "trace_id", parent_field=None))}

    def get(self, request, trace_id):
        """The answer trace: steps, evidence ids, answerability; never prompt or answer text."""
        return Response(answers.get_trace(request.user, trace_id).as_dict())
