"""The MCP tool table: each tool's input schema, the registered operation it runs as (its
capability action, rate-limit bucket and API-key scope) and its handler over one space.

Tools take the same parameters and bounds as the HTTP routes (camelCase members), return the
same JSON as structured output, and fail with the same codes (:func:`call` turns a
:class:`knowledgefs.errors.ServiceError` into ``{"error", "code", "status"}``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from knowledgefs.errors import InvalidInput, NotFound, ServiceError

from . import listing, reading, shell
from .tree import DocumentView, published_documents

SPACE = {"type": "string", "description": "the knowledge space id"}
PATH = {"type": "string", "minLength": 1, "maxLength": 384, "pattern": "^/"}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 100}
CURSOR = {"type": "string", "description": "nextCursor of the same listing"}
TOP_K = {"type": "integer", "minimum": 1, "maximum": 50}
SEARCH_MODE = {"type": "string", "enum": ["fast", "deep", "auto"]}


@dataclass(frozen=True)
class Tool:
    name: str
    action: str  # the registered operation (capability action) the tool runs as
    description: str
    properties: dict
    required: tuple[str, ...]
    handler: Callable[[Any, dict, Any], dict]  # (space, arguments, caller)

    def input_schema(self, space_required: bool = True) -> dict:
        required = (("knowledgeSpaceId",) if space_required else ()) + self.required
        return {
            "type": "object",
            "properties": {"knowledgeSpaceId": SPACE, **self.properties},
            "required": list(required),
            "additionalProperties": False,
        }


def _search(space, a: dict, caller=None, evidence: bool = False) -> dict:
    from ..evidence import from_retrieval
    from ..modes import retrieve

    query, top_k, mode = a.get("query"), a.get("topK", 10), a.get("mode")
    if mode not in (None, "fast", "deep", "auto"):
        raise InvalidInput("mode must be fast, deep or auto", code="invalid_mode")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 50:
        raise InvalidInput("topK must be an integer from 1 to 50", code="invalid_top_k")
    result = retrieve(space, query, top_k=top_k, mode=mode)
    if not evidence:
        return result.as_dict()
    assert isinstance(query, str)  # retrieve() refused anything else (400 invalid_query)
    items = from_retrieval(result.items, query)
    return {"query": query, "mode": result.mode, "evidence": [e.as_dict() for e in items]}


def _evidence(space, a: dict, caller=None) -> dict:
    return _search(space, a, caller, evidence=True)


def _outline(space, a: dict, caller=None) -> dict:
    ident = a.get("documentId")
    try:
        document = published_documents(space).filter(id=ident).first()
    except (ValueError, TypeError, ValidationError):  # malformed: not found, like a foreign one
        document = None
    if document is None:
        raise NotFound("document not found in this space", code="document_not_found")
    return reading.outline(DocumentView(document))


def _status(space, a: dict, caller=None) -> dict:
    from django.db.models import Count, Sum

    from ingestion.models import Document

    states = dict(
        Document.objects.filter(space=space)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    readable = published_documents(space).aggregate(n=Count("id"), nodes=Sum("node_count"))
    return {
        "id": str(space.id),
        "name": space.name,
        "slug": space.slug,
        "status": getattr(space, "status", None),
        "documents": {"byState": states, "readable": readable["n"]},
        "nodes": readable["nodes"] or 0,
        "index": space.index_versions.summary(),
    }


def _fs(name: str):
    return lambda space, a, caller: shell.run_fs(space, name, a, caller)


LIST = {"path": PATH, "limit": LIMIT, "cursor": CURSOR}
TOOLS: tuple[Tool, ...] = (
    Tool("knowledge.fs.ls", "knowledge_fs.ls", "List a directory of the knowledge filesystem.",
         LIST, ("path", "limit"), _fs("ls")),
    Tool("knowledge.fs.tree", "knowledge_fs.tree", "Entries below a path down to depth 1..8.",
         {**LIST, "depth": {"type": "integer", "minimum": 1, "maximum": 8}},
         ("path", "limit"), _fs("tree")),
    Tool("knowledge.fs.cat", "knowledge_fs.cat",
         "A file's rendered content (section markdown, table, outline JSON), paged.",
         {"path": PATH, "limit": {"type": "integer", "minimum": 1, "maximum": 65536},
          "cursor": CURSOR}, ("path",), _fs("cat")),
    Tool("knowledge.fs.stat", "knowledge_fs.stat",
         "Metadata of a path: sha256, size, version, parser status.", {"path": PATH},
         ("path",), _fs("stat")),
    Tool("knowledge.fs.grep", "knowledge_fs.grep",
         "Case-insensitive substring search with snippets and offsets.",
         {**LIST, "q": {"type": "string", "minLength": 1, "maxLength": 4000},
          "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 10000}},
         ("q", "path", "limit"), _fs("grep")),
    Tool("knowledge.fs.find", "knowledge_fs.find",
         "Entries below a path by name fragment, document metadata and resource type.",
         {**LIST, "nameContains": {"type": "string", "maxLength": 240},
          "metadataKey": {"type": "string", "maxLength": 120},
          "metadataValue": {"type": "string", "maxLength": 4000},
          "resourceType": {"type": "string", "enum": list(listing.RESOURCE_TYPES)}},
         ("path", "limit"), _fs("find")),
    Tool("knowledge.fs.diff", "knowledge_fs.diff", "Line or word differences of two files.",
         {"oldPath": PATH, "newPath": PATH, "mode": {"type": "string", "enum": ["line", "word"]}},
         ("oldPath", "newPath"), _fs("diff")),
    Tool("knowledge.fs.open_node", "knowledge_fs.open_node",
         "A node and its citation exactly as retrieval gives it.",
         {"nodeId": {"type": "string"}}, ("nodeId",),
         lambda space, a, caller: reading.open_node(space, a.get("nodeId"))),
    Tool("knowledge.search", "queries.create",
         "Fast, Deep or Auto retrieval with citations.",
         {"query": {"type": "string", "minLength": 1, "maxLength": 16000}, "topK": TOP_K,
          "mode": SEARCH_MODE}, ("query",), _search),
    Tool("knowledge.fetch_evidence", "queries.create",
         "Evidence items (text, citation, conflicts) for a query, best first.",
         {"query": {"type": "string", "minLength": 1, "maxLength": 16000}, "topK": TOP_K,
          "mode": SEARCH_MODE}, ("query",), _evidence),
    Tool("knowledge.get_document_outline", "knowledge_fs.cat",
         "The outline of a published document: sections, tables, figures, pages.",
         {"documentId": {"type": "string"}}, ("documentId",), _outline),
    Tool("knowledge.shell.plan", "knowledge_fs.shell_plan",
         "Plan a safe shell pipeline (ls|tree|cat|stat|grep|find|diff, then head|tail|wc|jq).",
         {"command": {"type": "string", "minLength": 1, "maxLength": 4000}}, ("command",),
         lambda space, a, caller: shell.plan(a.get("command"))),
    Tool("knowledge.shell.execute", "knowledge_fs.shell_execute",
         "Run a safe shell pipeline; output at most 128 KiB, then truncated.",
         {"command": {"type": "string", "minLength": 1, "maxLength": 4000}}, ("command",),
         lambda space, a, caller: shell.execute(space, a.get("command"), caller)),
    Tool("knowledge.space.status", "knowledge_spaces.read",
         "The space: documents by state, readable documents and nodes, the index.", {}, (),
         _status),
)  # fmt: skip
BY_NAME = {t.name: t for t in TOOLS}


def error_body(error: ServiceError) -> dict:
    body = {"error": error.message, "code": error.code, "status": error.status}
    if error.details is not None:
        body["details"] = error.details
    return body


def call(tool: Tool, space, arguments: dict, caller=None) -> dict:
    """Run ``tool`` on ``space`` for ``caller`` (:class:`.evidence.Caller`: what ``/evidence``
    shows); unknown members are refused like the HTTP routes do."""
    unknown = sorted(set(arguments) - set(tool.properties) - {"knowledgeSpaceId"})
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not an input of {tool.name}",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    return tool.handler(space, arguments, caller)
