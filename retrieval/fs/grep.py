"""``grep``: a case-insensitive substring search over the published text of a path, with
snippets and exact offsets into the canonical text.

The bound: a scope of at most :data:`SCAN_NODES` published nodes is scanned in full, in
keyset batches ordered by ``(document id, chunk index)``, checking the deadline between
batches; the database's case-insensitive ``LIKE`` picks the rows first where it folds case
like the exact test (:func:`_sql_prefilter`). A larger scope is narrowed first by the
space's keyword index (the tantivy index on SQLite, the text index on PostgreSQL) to its
:data:`KEYWORD_CANDIDATES` best nodes for the query, which are tested in rank order (the page's
order, and its cursor an offset in that ranking) in batches of ``2 × (limit + 1)``; the
response says so in ``scan``. Each match is the first occurrence in its node.
"""

from __future__ import annotations

import re
import time

from django.db.models import F, Q

from ingestion.models import DocumentState, KnowledgeNode
from knowledgefs.errors import InvalidInput, Unavailable

from ..text import is_blank
from . import listing, paths, tree
from .tree import DOCS, DocumentView

MAX_QUERY_CHARS = 4_000
MAX_TIMEOUT_MS = 10_000
SCAN_NODES = 20_000
KEYWORD_CANDIDATES = 500
BATCH = 500
SNIPPET_CONTEXT = 100
_COLUMNS = (
    "id", "document_id", "chunk_index", "kind", "page_number", "section_path", "start_offset",
    "end_offset", "text",
)  # fmt: skip


def check_query(q) -> str:
    if not isinstance(q, str) or is_blank(q):
        raise InvalidInput(
            "q is required (a string with visible text, not only whitespace)",
            code="invalid_query",
            details={"field": "q"},
        )
    if "\x00" in q:
        raise InvalidInput("q contains NUL", code="invalid_query", details={"field": "q"})
    try:
        q.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "q contains an unpaired surrogate (invalid Unicode)",
            code="invalid_query",
            details={"field": "q"},
        ) from None
    if len(q) > MAX_QUERY_CHARS:
        raise InvalidInput(
            f"q is {len(q)} characters; at most {MAX_QUERY_CHARS} are allowed",
            code="query_too_long",
            details={"field": "q", "limit": MAX_QUERY_CHARS},
        )
    return q


def check_timeout(value) -> int:
    if value in (None, ""):
        return MAX_TIMEOUT_MS
    number = listing._integer(value)
    if number is None or not 1 <= number <= MAX_TIMEOUT_MS:
        raise InvalidInput(
            f"timeoutMs must be an integer from 1 to {MAX_TIMEOUT_MS}",
            code="invalid_timeout",
            details={"field": "timeoutMs", "min": 1, "max": MAX_TIMEOUT_MS},
        )
    return number


def _scope(space, normal: str):
    """``(document view or None, node filter or None)`` of a path."""
    if normal in ("/", "/knowledge", DOCS):
        return None, None
    entry = tree.resolve(space, normal)
    if entry.document is None:  # the reserved roots hold nothing to search
        return "empty", None
    view = entry.document
    kind = entry.resource_type
    if kind == "section":
        assert isinstance(entry.payload, tree.Section)  # DocumentView.children() set it
        ids = {r[0] for r in entry.payload.nodes}
    elif kind == "table":
        assert isinstance(entry.payload, tuple)  # DocumentView.children(): the node row
        ids = {entry.payload[0]}
    elif kind == "page_text":
        ids = {r[0] for r in view.node_rows if r[3] == entry.payload}
    elif kind == "folder" and entry.name == "tables":
        ids = {r[0] for _, r in view.tables}
    elif kind == "folder" and entry.name == "sections":
        ids = {r[0] for r in view.node_rows if r[2] != "table"}
    elif kind == "page":
        ids = {r[0] for r in view.node_rows if r[3] == entry.payload}
    else:
        ids = None
    return view, ids


def _visible(space, view):
    rows = KnowledgeNode.objects.filter(
        space=space,
        generation=F("document__active_generation"),
        document__enabled=True,
        document__state=DocumentState.PUBLISHED,
    ).exclude(kind="image")  # image descriptions are no part of a document's text
    return rows.filter(document=view.document) if view is not None else rows


def grep(space, q, path, limit, cursor=None, timeout_ms=None) -> dict:
    started = time.monotonic()
    q = check_query(q)
    paths.check_path(path)
    limit = listing.check_limit(limit)
    timeout_ms = check_timeout(timeout_ms)
    deadline = started + timeout_ms / 1000
    normal = listing._normal(path)
    view, ids = _scope(space, normal)
    key = listing.listing_id(space, "grep", normal, limit, q)
    after = listing.read_cursor(cursor, key)
    pattern = re.compile(re.escape(q), re.IGNORECASE)
    if view == "empty":
        return {"path": normal, "matches": [], "truncated": False, "scan": {"mode": "full"}}
    base = _visible(space, view)
    if ids is not None:
        base = base.filter(id__in=ids)
    if view is not None or ids is not None:
        in_scope = SCAN_NODES
    else:  # the nodes stored in the space, counted up to the bound (an index range)
        stored = KnowledgeNode.objects.filter(space=space).values_list("generation", flat=True)
        in_scope = stored[: SCAN_NODES + 1].count()  # covered by the (space, generation) index
    hits: list[tuple] = []
    last = None
    stopped = False
    if in_scope <= SCAN_NODES:
        if after and after[0] == "k":
            raise listing.invalid_cursor()
        scan = {"mode": "full"}
        if after:
            base = base.filter(
                Q(document_id__gt=after[0]) | Q(document_id=after[0], chunk_index__gt=after[1])
            )
        if _sql_prefilter(q):
            base = base.filter(text__icontains=q)
            scan["prefilter"] = "sql"
        rows = base.order_by("document_id", "chunk_index")
        while len(hits) <= limit:
            batch = list(rows.values_list(*_COLUMNS)[:BATCH])
            for row in batch:
                match = pattern.search(row[8])
                last = row
                if match:
                    hits.append((row, match))
                    if len(hits) > limit:
                        break
            if len(batch) < BATCH or len(hits) > limit:
                break
            if time.monotonic() > deadline:
                stopped = True
                break
            assert last is not None  # a full batch was read
            rows = base.filter(
                Q(document_id__gt=last[1]) | Q(document_id=last[1], chunk_index__gt=last[2])
            ).order_by("document_id", "chunk_index")
        more = len(hits) > limit
        page = hits[:limit]
        next_row = page[-1][0] if more else (last if stopped else None)
        next_key = [next_row[1].hex, next_row[2]] if next_row is not None else None
    else:
        if after and after[0] != "k":
            raise listing.invalid_cursor()
        offset = after[1] if after else 0
        page, next_offset, scan, stopped = _keyword_candidates(
            space, q, (view, ids), pattern, limit, offset, deadline
        )
        next_key = ["k", next_offset] if next_offset is not None else None
    if stopped and not page:
        raise Unavailable(
            f"grep found nothing within its deadline of {timeout_ms} ms; narrow the path or "
            "raise timeoutMs (at most 10000)",
            code="fs_grep_deadline_exceeded",
            details={"timeoutMs": timeout_ms},
        )
    body: dict[str, object] = {"path": normal, "matches": _matches(page), "scan": scan}
    body["truncated"] = next_key is not None
    if stopped:
        body["deadlineReached"] = True
    if next_key is not None:
        body["nextCursor"] = listing.make_cursor(key, next_key)
    body["tookMs"] = round((time.monotonic() - started) * 1000, 1)
    return body


def _sql_prefilter(q: str) -> bool:
    """Whether the database's case-insensitive ``LIKE`` may pick the rows first: PostgreSQL's
    ``UPPER … LIKE`` always; SQLite's ``LIKE`` folds ASCII only, so only for an ASCII query.
    The exact test in this process still decides every match."""
    from django.db import connection

    return connection.vendor == "postgresql" or q.isascii()


def _readable_rows(space, ids: list, scope) -> dict:
    """``{id: row}`` of the nodes ``ids`` that are readable and inside ``scope`` (a document view
    or ``None``, node ids or ``None``); read by primary key, checked here."""
    view, allowed = scope
    found = KnowledgeNode.objects.filter(id__in=ids).values_list(
        *_COLUMNS, "space_id", "generation", "document__active_generation",
        "document__enabled", "document__state",
    )  # fmt: skip
    rows = {}
    for r in found:
        row, (space_id, generation, active, enabled, state) = r[:9], r[9:]
        if space_id != space.id or generation != active or not enabled:
            continue
        if state != DocumentState.PUBLISHED:
            continue
        if view is not None and row[1] != view.document.id:
            continue
        if allowed is not None and row[0] not in allowed:
            continue
        rows[row[0]] = row
    return rows


def _keyword_candidates(space, q, scope, pattern, limit, offset, deadline):
    """The keyword index's best :data:`KEYWORD_CANDIDATES` nodes for ``q``, walked in rank order
    from ``offset`` in batches, each tested exactly; ``(hits, next offset, scan, stopped)``."""
    from ..backends import get_search_backend

    ranked = [
        s.node_id for s in get_search_backend().keyword_search(space.id, q, KEYWORD_CANDIDATES)
    ]
    scan = {"mode": "keyword_candidates", "candidates": len(ranked)}
    hits: list[tuple] = []
    position = offset
    stopped = False
    size = 2 * (limit + 1)
    while position < len(ranked) and len(hits) <= limit:
        batch = ranked[position : position + size]
        rows = _readable_rows(space, batch, scope)
        for node_id in batch:
            position += 1
            row = rows.get(node_id)
            match = pattern.search(row[8]) if row is not None else None
            if match:
                hits.append((row, match))
                if len(hits) > limit:
                    position -= 1  # the next page starts with this one
                    break
        if len(hits) <= limit and time.monotonic() > deadline:
            stopped = True
            break
    more = len(hits) > limit or (stopped and position < len(ranked))
    return hits[:limit], (position if more else None), scan, stopped


def _matches(page: list[tuple]) -> list[dict]:
    from ingestion.models import Document

    documents = Document.objects.in_bulk({row[1] for row, _ in page})
    views = {ident: DocumentView(d) for ident, d in documents.items()}
    out = []
    for row, match in page:
        doc_id = row[1]
        view = views[doc_id]
        text = row[8]
        lo = max(0, match.start() - SNIPPET_CONTEXT)
        hi = min(len(text), match.end() + SNIPPET_CONTEXT)
        out.append(
            {
                "kind": "node",
                "path": tree.node_path(view, (row[0], *row[2:8])),
                "nodeId": str(row[0]),
                "snippet": text[lo:hi],
                "snippetStartOffset": row[6] + lo,
                "startOffset": row[6] + match.start(),
                "endOffset": row[6] + match.end(),
                "metadata": {
                    "documentId": str(doc_id),
                    "filename": view.document.filename,
                    "pageNumber": row[4],
                    "sectionPath": list(row[5] or []),
                },
            }
        )
    return out
