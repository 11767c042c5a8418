"""``/mcp``: the MCP server (:mod:`retrieval.fs.mcp`) over streamable HTTP in the service.

The service runs sync WSGI workers; the SDK's streamable-HTTP transport is ASGI. Each request
runs one stateless ``StreamableHTTPSessionManager`` in JSON-response mode (no session, no SSE
stream: a POST carries JSON-RPC and gets its JSON answer) on an event loop of its own for the
length of the request. The caller is authenticated like any product route (an API key, or a
capability token of caller kind ``mcp``); each tool call then passes the registered operation
of its tool (:data:`OPERATIONS`: capability action and resource, grants, tenant gates, the
rate limit of that operation) and the space lookup, so a space-bound key reaches only its space.
"""

from __future__ import annotations

import dataclasses

import anyio
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from knowledgefs.auth.operations import Operation
from knowledgefs.auth.permissions import OperationPermission
from knowledgefs.auth.principal import Principal
from knowledgefs.auth.throttling import OperationThrottle
from knowledgefs.errors import InvalidInput, ServiceError
from spaces.api.views import KnowledgeSpaceDetailView
from spaces.services import get_space

from ..fs import mcp
from ..fs.evidence import Caller
from . import fs
from .views import RetrievalTestView

MAX_BODY_BYTES = 1024 * 1024


def _operations() -> dict:
    views = (
        fs.FsLsView, fs.FsTreeView, fs.FsCatView, fs.FsStatView, fs.FsGrepView, fs.FsFindView,
        fs.FsDiffView, fs.FsOpenNodeView, fs.ShellPlanView, fs.ShellExecuteView,
        RetrievalTestView, KnowledgeSpaceDetailView,
    )  # fmt: skip
    found = {}
    for view in views:
        for operation in view.operations.values():
            found[operation.action] = dataclasses.replace(
                operation, callers=operation.callers | {"mcp"}
            )
    return found


#: The registered operation of every tool's action, open to the ``mcp`` caller kind.
OPERATIONS = _operations()


class Refused(ServiceError):
    """A DRF refusal (401/403/429) carried as a tool error."""


def _refused(error: APIException) -> Refused:
    codes = error.get_codes()
    code = codes if isinstance(codes, str) else "permission_denied"
    refused = Refused(str(error.detail), code=code)
    refused.status = error.status_code
    return refused


class _ToolRoute(APIView):
    """What the permission and the throttle read of a route, for one tool call: the tool's
    operation under the request's method and the space the call names."""

    def __init__(self, method: str | None, operation: Operation, space_id: str) -> None:
        super().__init__()
        self.operations = {method: operation}
        self.kwargs = {"space_id": space_id}


def authorizer(request: Request):
    def authorize(tool, arguments: dict):
        space_id = arguments.get("knowledgeSpaceId")
        if not isinstance(space_id, str) or not space_id:
            raise InvalidInput(
                "knowledgeSpaceId is required", code="invalid_request",
                details={"field": "knowledgeSpaceId"},
            )  # fmt: skip
        operation = OPERATIONS[tool.action]
        route = _ToolRoute(request.method, operation, space_id)
        try:
            OperationPermission().has_permission(request, route)
            OperationThrottle().allow_request(request, route)
        except APIException as error:
            raise _refused(error) from None
        principal = request.user
        assert isinstance(principal, Principal)  # _authenticate() let only a Principal through
        return get_space(principal, space_id), Caller.of(principal)

    return authorize


def _authenticate(django_request) -> tuple[Request | None, JsonResponse | None]:
    request = Request(
        django_request,
        # the stub types the setting as import strings; api_settings gives the classes
        authenticators=[cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES],  # type: ignore[operator]
    )
    try:
        principal = request.user
    except APIException as error:
        codes = error.get_codes()
        return None, JsonResponse(
            {"code": codes if isinstance(codes, str) else "not_authenticated",
             "message": str(error.detail)},
            status=error.status_code,
        )  # fmt: skip
    if not isinstance(principal, Principal) or not principal.is_authenticated:
        return None, JsonResponse(
            {"code": "not_authenticated", "message": "an API key or capability token is required"},
            status=401,
        )
    if principal.kind == "capability" and principal.caller_kind != "mcp":
        return None, JsonResponse(
            {
                "code": "caller_kind_not_permitted",
                "message": "/mcp takes tokens of caller kind mcp",
            },
            status=403,
        )
    if principal.kind == "internal":
        return None, JsonResponse(
            {"code": "credential_not_permitted", "message": "/mcp does not take the inner key"},
            status=403,
        )
    return request, None


@csrf_exempt
def endpoint(django_request):
    """``POST /mcp`` (JSON-RPC, JSON responses); ``GET``/``DELETE`` are answered by the SDK
    (no stream and no session in stateless mode)."""
    request, refusal = _authenticate(django_request)
    if refusal is not None:
        return refusal
    assert request is not None  # _authenticate() returns the request or a refusal
    body = django_request.body
    if len(body) > MAX_BODY_BYTES:
        return JsonResponse(
            {"code": "body_too_large", "message": f"at most {MAX_BODY_BYTES} bytes"}, status=413
        )
    server = mcp.build_server(authorizer(request))
    status, headers, content = serve_asgi(server, django_request, body)
    response = HttpResponse(content, status=status)
    for name, value in headers:
        if name.lower() not in ("content-length", "connection", "transfer-encoding"):
            response[name] = value
    return response


def serve_asgi(server, django_request, body: bytes) -> tuple[int, list, bytes]:
    """Run one request through the SDK's stateless JSON-response transport."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    headers = [
        (key[5:].replace("_", "-").lower().encode("latin-1"), value.encode("latin-1"))
        for key, value in django_request.META.items()
        if key.startswith("HTTP_") and isinstance(value, str)
    ]
    for key, name in (("CONTENT_TYPE", b"content-type"), ("CONTENT_LENGTH", b"content-length")):
        if django_request.META.get(key):
            headers.append((name, django_request.META[key].encode("latin-1")))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": django_request.method,
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "root_path": "",
        "query_string": django_request.META.get("QUERY_STRING", "").encode("latin-1"),
        "headers": headers,
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 0),
    }
    status = [500]
    out_headers: list = []
    chunks: list[bytes] = []

    async def main() -> None:
        done = anyio.Event()
        sent = [False]

        async def receive():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                out_headers.extend(
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]
                )
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        manager = StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)
        async with manager.run():
            await manager.handle_request(scope, receive, send)

    anyio.run(main)
    return status[0], out_headers, b"".join(chunks)
