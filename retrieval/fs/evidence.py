"""``/evidence``: the answer traces of a space as directories, seen by the caller who may read
them over HTTP (``GET /v1/queries/{id}``, :func:`retrieval.answers.traces.get_trace`).

``/evidence/<trace id>/query.json`` holds what the trace keeps of the query (its SHA-256 and
length, never the text), the modes and the times; ``/evidence/<trace id>/items/<nnn>`` (``001``
…) is each evidence item in rank order with its citation exactly as retrieval gives it
(:func:`retrieval.recall.hydrate`) and its file under ``/knowledge`` while its generation is
still published. Visibility is the trace route's: the caller's tenant, a space the caller
reaches, and for a trace made with a capability token only the same subject; anything else is
404 ``fs_path_not_found`` like a path that does not exist.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from django.db.models import Q
from django.utils.dateparse import parse_datetime

from ..models import AnswerTrace
from . import tree
from .tree import DocumentView, Entry, node_path, not_found, visible_node

ROOT = "/evidence"
QUERY_FILE = "query.json"
ITEMS = "items"


@dataclass(frozen=True)
class Caller:
    """Who reads the filesystem: what the trace visibility needs of the request principal.

    ``kind`` is ``api_key``, ``capability`` or ``operator``; ``owner`` the principal's owner
    label (a trace's ``requester``); ``space_ids`` the spaces it reaches (``None``: all)."""

    tenant_id: str
    kind: str = "operator"
    owner: str = ""
    space_ids: frozenset | None = None

    @classmethod
    def of(cls, principal) -> Caller:
        return cls(principal.tenant_id, principal.kind, principal.owner, principal.space_ids)

    @classmethod
    def operator(cls, space) -> Caller:
        """The command line's caller: the space's tenant, every trace of the space."""
        return cls(space.tenant_id, "operator", f"operator:{space.tenant_id}")


def visible_traces(space, caller: Caller | None):
    """The traces of ``space`` that ``caller`` may read (none without a caller)."""
    if caller is None or (caller.space_ids is not None and space.id not in caller.space_ids):
        return AnswerTrace.objects.none()
    traces = AnswerTrace.objects.filter(space=space, tenant_id=caller.tenant_id)
    if caller.kind == "capability":
        traces = traces.filter(requester_kind="capability", requester=caller.owner)
    return traces


def trace_entry(trace: AnswerTrace) -> Entry:
    return Entry(
        "directory",
        str(trace.id),
        f"{ROOT}/{trace.id}",
        "trace",
        str(trace.id),
        trace.created_at.isoformat() if trace.created_at else None,
        {
            "mode": trace.mode,
            "createdAt": trace.created_at.isoformat() if trace.created_at else None,
            "completed": trace.completed,
            "itemCount": len(trace.evidence_node_ids or []),
        },
        payload=trace,
    )


def page(space, caller, after, size: int) -> list[Entry]:
    """Up to ``size`` visible traces, newest first, after the keyset ``[created_at, id]``."""
    rows = visible_traces(space, caller)
    if after:
        created, ident = parse_datetime(after[0]), after[1]
        rows = rows.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=ident))
    return [trace_entry(t) for t in rows.order_by("-created_at", "-id")[:size]]


def key(entry: Entry) -> list:
    trace = entry.payload
    assert isinstance(trace, AnswerTrace)  # a trace entry (trace_entry) carries its trace
    return [trace.created_at.isoformat(), trace.id.hex]


def find_trace(space, caller, name: str) -> AnswerTrace:
    try:
        ident = uuid.UUID(name)
    except ValueError:
        raise not_found(f"{ROOT}/{name}") from None
    if str(ident) != name:  # one spelling per trace: the canonical one
        raise not_found(f"{ROOT}/{name}")
    trace = visible_traces(space, caller).filter(id=ident).first()
    if trace is None:
        raise not_found(f"{ROOT}/{name}")
    return trace


def _item_name(rank: int) -> str:
    return f"{rank:03d}"


def children(trace: AnswerTrace, rest: list[str]) -> list[Entry]:
    base = f"{ROOT}/{trace.id}"
    if not rest:
        return [
            Entry("directory", ITEMS, f"{base}/{ITEMS}", "evidence_items", str(trace.id),
                  payload=trace),
            Entry("file", QUERY_FILE, f"{base}/{QUERY_FILE}", "trace_query", str(trace.id),
                  payload=trace),
        ]  # fmt: skip
    if rest == [ITEMS]:
        return [
            Entry(
                "file",
                _item_name(rank),
                f"{base}/{ITEMS}/{_item_name(rank)}",
                "evidence_item",
                str(node_id),
                metadata={"rank": rank},
                payload=(trace, rank, node_id),
            )  # fmt: skip
            for rank, node_id in enumerate(trace.evidence_node_ids or [], 1)
        ]
    raise not_found(f"{base}/{'/'.join(rest)}")


def resolve(space, normal: str, caller: Caller | None) -> Entry:
    """The entry at the normal path ``normal`` for ``caller``: below ``/evidence`` a trace it
    may read, anywhere else :func:`.tree.resolve`."""
    segments = [s for s in normal.split("/") if s]
    if len(segments) < 2 or segments[0] != ROOT[1:]:
        return tree.resolve(space, normal)
    return _resolve_trace(space, caller, segments[1:])


def _resolve_trace(space, caller, segments: list[str]) -> Entry:
    """The entry at ``/evidence/<segments>`` (``segments`` non-empty)."""
    trace = find_trace(space, caller, segments[0])
    rest = segments[1:]
    if not rest:
        return trace_entry(trace)
    for entry in children(trace, rest[:-1]):
        if entry.name == rest[-1]:
            return entry
    raise not_found(f"{ROOT}/{'/'.join(segments)}")


def render(space, entry: Entry) -> str:
    """The JSON text of ``query.json`` or of an evidence item."""
    if entry.resource_type == "trace_query":
        t = entry.payload
        assert isinstance(t, AnswerTrace)  # children(): query.json carries its trace
        body = {
            "traceId": str(t.id),
            "query": {"sha256": t.query_sha256, "chars": t.query_chars},
            "mode": t.mode,
            "requestedMode": t.requested_mode or None,
            "source": t.source,
            "answerability": t.answerability or None,
            "completed": t.completed,
            "createdAt": t.created_at.isoformat() if t.created_at else None,
            "completedAt": t.completed_at.isoformat() if t.completed_at else None,
            "itemCount": len(t.evidence_node_ids or []),
        }
        return json.dumps(body, ensure_ascii=False, indent=1)
    assert isinstance(entry.payload, tuple)  # children(): an item is (trace, rank, node id)
    trace, rank, node_id = entry.payload
    body = {"traceId": str(trace.id), "rank": rank, "nodeId": str(node_id)}
    body.update(item(space, node_id))
    return json.dumps(body, ensure_ascii=False, indent=1)


def item(space, node_id) -> dict:
    """The citation of a node as retrieval gives it (``None`` once the node is gone or its
    document disabled) and its file under ``/knowledge`` (``None`` unless still published)."""
    from ..recall import hydrate

    try:
        ident = uuid.UUID(str(node_id))
    except ValueError:
        return {"citation": None, "text": None, "path": None}
    found = hydrate([(ident, 0.0, {})])
    node = visible_node(space, ident)
    path = None
    if node is not None:
        row = (
            node.id, node.chunk_index, node.kind, node.page_number, node.section_path,
            node.start_offset, node.end_offset,
        )  # fmt: skip
        path = node_path(DocumentView(node.document), row)
    return {
        "citation": found[0].citation if found else None,
        "text": found[0].text if found else None,
        "path": path,
    }
