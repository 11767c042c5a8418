"""The operation registry: every route and method declares one action and one resource binding.

A view lists its operations in a class attribute::

    class KnowledgeSpaceDetailView(APIView):
        operations = {
            "GET": Operation("knowledge_spaces.read", space_from("path")),
            ...
        }

:class:`knowledgefs.auth.permissions.OperationPermission` refuses a method without an
operation, and a capability token whose ``action`` or ``resource`` is not the operation's. API
keys are scoped by the queryset (their bound spaces) instead; the inner API key reaches only
``internal`` operations. Operation ids name throttle buckets, so rate limits can be overridden
per operation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

# Dify caller kinds that may use product routes. ``internal_worker`` tokens are for Dify's
# background workers, ``mcp`` for MCP sessions: neither reaches a product route unless listed
# (the knowledge filesystem's operations list ``mcp``: retrieval/api/fs.py).
READ_CALLERS = frozenset({"interactive", "service", "agent", "workflow"})
WRITE_CALLERS = frozenset({"interactive", "service", "workflow"})
ADMIN_CALLERS = frozenset({"interactive", "service"})


@dataclass(frozen=True)
class Binding:
    """Where a request names its resource.

    ``type`` is the capability resource type the operation acts on; ``source`` is ``path``,
    ``body``, ``query`` or ``none`` (namespace-wide operations); ``field`` names the path
    parameter, body member or query parameter holding the resource id, and ``parent_field``
    the one holding its knowledge space (``None`` when the request does not name it, as for
    ``/v1/jobs/{job_id}``: the token's ``parent_id`` then scopes the lookup).
    """

    type: str
    source: str = "path"
    field: str | None = None
    parent_field: str | None = None

    def values(self, request: Any, view_kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
        """Return ``(resource_id, parent_id)`` as named by the request (``None`` if absent)."""
        if self.source == "none":
            return None, None
        if self.source == "path":
            container = view_kwargs
        elif self.source == "query":
            container = request.query_params
        else:
            container = request.data if hasattr(request.data, "get") else {}
        ident = container.get(self.field) if self.field else None
        parent = None
        if self.parent_field:
            # a parent named in the path is read from the path whatever the id's source
            parent = view_kwargs.get(self.parent_field, container.get(self.parent_field))
        return _text(ident), _text(parent)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Operation:
    """One registered operation: ``action`` (also its id), binding, allowed caller kinds.

    ``internal`` operations are reached only with the inner API key; product operations never
    are. ``read`` derives the scope label (read or write) documented per route.
    """

    action: str
    binding: Binding
    callers: frozenset[str] = field(default=READ_CALLERS)
    internal: bool = False

    @property
    def operation_id(self) -> str:
        return self.action

    @property
    def read(self) -> bool:
        verb = self.action.rsplit(".", 1)[-1]
        return verb in {"list", "read", "read_text", "read_asset"} or self.action in (
            "queries.create",
            "queries.answer",
        )


def namespace_wide() -> Binding:
    """Operations on the whole tenant (list or create spaces): token resource ``namespace``."""
    return Binding(type="namespace", source="none")


def space_from(source: str = "path", field: str = "space_id") -> Binding:
    """Operations on one knowledge space named by ``field`` in the path, body or query."""
    return Binding(type="knowledge_space", source=source, field=field)


def child(kind: str, field: str, parent_field: str | None = "space_id") -> Binding:
    """Operations on a child resource (``document``, ``job``...) of a knowledge space."""
    return Binding(type=kind, source="path", field=field, parent_field=parent_field)


def same_id(a: str | None, b: str | None) -> bool:
    """Compare resource ids, canonicalising UUIDs (case, braces, hyphens) on both sides."""
    if a is None or b is None:
        return False
    try:
        return uuid.UUID(a) == uuid.UUID(b)
    except ValueError:
        return a == b


def operation_for(view: Any, method: str) -> Operation | None:
    """The operation ``view`` registers for HTTP ``method`` (HEAD falls back to GET)."""
    operations = getattr(view, "operations", None) or {}
    found = operations.get(method.upper())
    if found is None and method.upper() == "HEAD":
        found = operations.get("GET")
    return found
