"""The MCP server of the knowledge filesystem, built with the official MCP SDK's low-level
server (``mcp.server.lowlevel.Server``) over the tool table :mod:`retrieval.fs.tools`.

Transports are the callers' business: ``kfs mcp`` serves it on stdio for one space
(:func:`serve_stdio`), the service mounts it at ``/mcp`` in the SDK's stateless streamable-HTTP
JSON-response mode (``retrieval/api/mcp.py``). ``authorize(tool, arguments)`` returns the space a
call acts on and its :class:`~.evidence.Caller`, or raises a
:class:`knowledgefs.errors.ServiceError`; refusals and not-found are tool errors (``isError``)
whose structured content is ``{"error", "code", "status"}``, the codes of the HTTP routes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
from mcp import types
from mcp.server.lowlevel import Server

from knowledgefs.errors import NotFound, ServiceError

from . import tools

NAME = "knowledge-fs"
VERSION = "1.0.0"


def tool_error(error: ServiceError) -> types.CallToolResult:
    body = tools.error_body(error)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
        structuredContent=body,
        isError=True,
    )


def run_tool(authorize: Callable, name: str, arguments: dict | None):
    """One tool call, synchronously (database work): the result dict or a tool error."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        tool = tools.BY_NAME.get(name)
        if tool is None:
            raise NotFound(f"no tool named {name!r}", code="unknown_tool")
        arguments = dict(arguments or {})
        space, caller = authorize(tool, arguments)
        return tools.call(tool, space, arguments, caller)
    except ServiceError as error:
        return tool_error(error)
    finally:
        close_old_connections()


def build_server(authorize: Callable, *, space_required: bool = True) -> Server:
    """The server; ``space_required`` makes ``knowledgeSpaceId`` a required input (HTTP), while
    a stdio server bound to one space takes it as optional."""
    server = Server(NAME, version=VERSION)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [
            types.Tool(
                name=t.name,
                description=t.description,
                inputSchema=t.input_schema(space_required),
            )
            for t in tools.TOOLS
        ]

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict):
        return await anyio.to_thread.run_sync(run_tool, authorize, name, arguments)

    return server


def bound_to(space) -> Callable:
    """``authorize`` of a server bound to one space (stdio): another ``knowledgeSpaceId`` is
    ``space_not_found``, as for a foreign space over HTTP. The caller is the operator of the
    space (the command line's principal)."""
    from .evidence import Caller

    caller = Caller.operator(space)

    def authorize(tool, arguments: dict):
        named = arguments.get("knowledgeSpaceId")
        if named not in (None, "") and str(named) != str(space.id):
            raise NotFound("knowledge space not found", code="space_not_found")
        return space, caller

    return authorize


def serve_stdio(space) -> None:
    """Serve the tools of ``space`` on stdin/stdout until the client closes the stream."""
    from mcp.server.stdio import stdio_server

    server = build_server(bound_to(space), space_required=False)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
