"""``ls``, ``tree`` and ``find``: listings of the tree with a required ``limit`` and a signed
cursor bound to its listing.

Documents are read from the database in pages of ``limit + 1`` rows, ordered by
``(filename, id)`` with a keyset, and only readable ones (published, enabled, active
generation) are ever selected: the permission filter is part of the query. ``find`` filters in
this process; when :data:`SCAN_PAGES` pages of documents do not fill its page it answers 503
``fs_scan_budget_exhausted`` rather than a short page that looks final.
"""

from __future__ import annotations

import hashlib
import json
import re

from django.core import signing
from django.db.models import Q

from knowledgefs.errors import InvalidInput, Unavailable

from . import evidence, paths, tree
from .tree import DOCS, DocumentView, Entry

MAX_LIMIT = 100
MAX_DEPTH = 8
SCAN_PAGES = 10
MAX_NAME_FRAGMENT = 240
MAX_METADATA_KEY = 120
MAX_METADATA_VALUE = 4000
RESOURCE_TYPES = (
    "document", "folder", "outline", "section", "table", "figure", "page", "page_text",
    "page_image", "trace", "trace_query", "evidence_items", "evidence_item",
)  # fmt: skip
_SALT = "knowledgefs.fs.cursor"


# --- parameters -------------------------------------------------------------------------------
def check_limit(value, *, required: bool = True, default: int = 20) -> int:
    """``limit``: an integer 1..100 (400 ``invalid_limit``; missing and required too)."""
    if value is None or value == "":
        if required:
            raise InvalidInput(
                f"limit is required (1..{MAX_LIMIT})",
                code="invalid_limit",
                details={"field": "limit", "min": 1, "max": MAX_LIMIT},
            )
        return default
    number = _integer(value)
    if number is None or not 1 <= number <= MAX_LIMIT:
        raise InvalidInput(
            f"limit must be an integer from 1 to {MAX_LIMIT}",
            code="invalid_limit",
            details={"field": "limit", "min": 1, "max": MAX_LIMIT},
        )
    return number


def check_depth(value) -> int:
    if value is None or value == "":
        return 2
    number = _integer(value)
    if number is None or not 1 <= number <= MAX_DEPTH:
        raise InvalidInput(
            f"depth must be an integer from 1 to {MAX_DEPTH}",
            code="invalid_depth",
            details={"field": "depth", "min": 1, "max": MAX_DEPTH},
        )
    return number


def _integer(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,9}", value.strip()):
        return int(value)
    return None


def listing_id(space, op: str, *parts, caller=None) -> str:
    """What a cursor is bound to: the space, the operation and every parameter but the page."""
    who = [caller.tenant_id, caller.kind, caller.owner] if caller is not None else []
    text = json.dumps([str(space.id), op, *parts, *who], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def make_cursor(listing: str, key) -> str:
    return signing.dumps({"l": listing, "k": key}, salt=_SALT, compress=True)


def invalid_cursor() -> InvalidInput:
    return InvalidInput(
        "cursor is not a cursor of this listing (pass the nextCursor of the same request)",
        code="invalid_cursor",
        details={"field": "cursor"},
    )


def read_cursor(cursor, listing: str):
    """The position stored in ``cursor`` (``None`` for no cursor); 400 ``invalid_cursor`` when
    it is forged, damaged or was issued by another listing."""
    if cursor in (None, ""):
        return None
    try:
        data = signing.loads(str(cursor), salt=_SALT)
    except signing.BadSignature:
        data = None
    if not isinstance(data, dict) or data.get("l") != listing:
        raise invalid_cursor()
    return data.get("k")


# --- documents in pages -----------------------------------------------------------------------
def document_page(space, after, size: int) -> list[DocumentView]:
    """Up to ``size`` readable documents after the keyset ``after`` (``[filename, id hex]``)."""
    rows = tree.published_documents(space)
    if after:
        filename, ident = after
        rows = rows.filter(Q(filename__gt=filename) | Q(filename=filename, id__gt=ident))
    return [DocumentView(d) for d in rows.order_by("filename", "id")[:size]]


def _key(view: DocumentView) -> list:
    return [view.document.filename, view.document.id.hex]


# --- ls ---------------------------------------------------------------------------------------
def ls(space, path, limit, cursor=None, caller=None) -> dict:
    """A page of the children of ``path``; ``/evidence`` lists the traces ``caller`` may read
    (:class:`.evidence.Caller`), newest first."""
    paths.check_path(path)
    limit = check_limit(limit)
    normal = _normal(path)
    listing = listing_id(space, "ls", normal, limit, caller=caller)
    after = read_cursor(cursor, listing)
    next_key: list | str | None
    if normal == evidence.ROOT:
        items = evidence.page(space, caller, after, limit + 1)
        more = len(items) > limit
        items = items[:limit]
        next_key = evidence.key(items[-1]) if more else None
    elif normal == DOCS:
        views = document_page(space, after, limit + 1)
        shown, more = views[:limit], len(views) > limit
        items = [v.entry() for v in shown]
        next_key = _key(shown[-1]) if more else None
    else:
        entries = children_of(space, normal, caller)
        if after is not None:
            entries = [e for e in entries if e.name > after]
        page, more = entries[:limit], len(entries) > limit
        items = page
        next_key = page[-1].name if more else None
    return _page(normal, items, listing, next_key)


def children_of(space, normal: str, caller=None) -> list[Entry]:
    fixed = tree.fixed_children(normal)
    if fixed is not None:
        return fixed
    entry = evidence.resolve(space, normal, caller)
    if entry.kind == "file":
        return [entry]
    if entry.resource_type in ("trace", "evidence_items"):
        rest = entry.path[len(evidence.ROOT) + 1 :].split("/")[1:]
        return evidence.children(_trace_of(entry), rest)
    view = entry.document
    # every other directory is a document's: the fixed ones, /knowledge/docs and /evidence are
    # listed above or by the caller (ls)
    assert view is not None
    rel = entry.path[len(view.path) + 1 :]
    return view.children(rel.split("/") if rel else [])


def _normal(path: str) -> str:
    return "/" + "/".join(s for s in path.split("/") if s)


def _page(normal: str, items: list[Entry], listing: str, next_key, **extra) -> dict:
    body = {
        "path": normal,
        "items": [e.as_dict() for e in items],
        "truncated": next_key is not None,
        **extra,
    }
    if next_key is not None:
        body["nextCursor"] = make_cursor(listing, next_key)
    return body


# --- the walk (tree and find) -----------------------------------------------------------------
class Budget:
    """Counts the document pages a walk reads; ``exhausted`` once :data:`SCAN_PAGES` are read
    and more remain."""

    def __init__(self, page_size: int, pages: int | None) -> None:
        self.page_size = page_size
        self.pages = pages
        self.read = 0
        self.exhausted = False


def _trace_of(entry: Entry):
    """The trace a ``trace`` or ``evidence_items`` entry stands for."""
    return entry.payload


def walk(space, normal: str, depth: int, budget: Budget, caller=None):
    """``(entry, depth)`` below ``normal`` down to ``depth``, depth first in listing order."""
    if normal == evidence.ROOT:
        after = None
        while True:
            if budget.pages is not None and budget.read >= budget.pages:
                budget.exhausted = True
                return
            traces = evidence.page(space, caller, after, budget.page_size)
            budget.read += 1
            for entry in traces:
                yield entry, 1
                if depth > 1:
                    for sub, d in _walk_trace(entry.payload, [], depth - 1):
                        yield sub, d + 1
            if len(traces) < budget.page_size:
                return
            after = evidence.key(traces[-1])
    if normal == DOCS:
        after = None
        while True:
            if budget.pages is not None and budget.read >= budget.pages:
                budget.exhausted = True
                return
            views = document_page(space, after, budget.page_size)
            budget.read += 1
            for view in views:
                yield view.entry(), 1
                if depth > 1:
                    for entry, d in _walk_document(view, [], depth - 1):
                        yield entry, d + 1
            if len(views) < budget.page_size:
                return
            after = _key(views[-1])
        return
    fixed = tree.fixed_children(normal)
    if fixed is not None:
        for entry in fixed:
            yield entry, 1
            if depth > 1:
                for sub, d in walk(space, entry.path, depth - 1, budget, caller):
                    yield sub, d + 1
        return
    entry = evidence.resolve(space, normal, caller)
    if entry.resource_type in ("trace", "evidence_items"):
        rest = entry.path[len(evidence.ROOT) + 1 :].split("/")[1:]
        yield from _walk_trace(_trace_of(entry), rest, depth)
    elif entry.kind == "directory":
        document = entry.document
        assert document is not None  # the fixed directories and /knowledge/docs are walked above
        rel = entry.path[len(document.path) + 1 :]
        yield from _walk_document(document, rel.split("/") if rel else [], depth)


def _walk_trace(trace, rest: list[str], depth: int):
    for child in evidence.children(trace, rest):
        yield child, 1
        if child.kind == "directory" and depth > 1:
            for entry, d in _walk_trace(trace, [*rest, child.name], depth - 1):
                yield entry, d + 1


def _walk_document(view: DocumentView, rel: list[str], depth: int):
    for child in view.children(rel):
        yield child, 1
        if child.kind == "directory" and depth > 1:
            sub = child.path[len(view.path) + 1 :].split("/")
            for entry, d in _walk_document(view, sub, depth - 1):
                yield entry, d + 1


def tree_listing(space, path, limit, depth=None, cursor=None, caller=None) -> dict:
    """Entries below ``path`` down to ``depth`` (1..8, default 2), depth first, at most
    ``limit`` per page; each item carries its ``depth``."""
    paths.check_path(path)
    limit = check_limit(limit)
    depth = check_depth(depth)
    normal = _normal(path)
    root = evidence.resolve(space, normal, caller)
    listing = listing_id(space, "tree", normal, limit, depth, caller=caller)
    offset = read_cursor(cursor, listing) or 0
    items: list[dict] = []
    position = 0
    more = False
    budget = Budget(MAX_LIMIT + 1, None)
    for entry, d in walk(space, normal, depth, budget, caller):
        if position >= offset:
            if len(items) == limit:
                more = True
                break
            items.append({**entry.as_dict(), "depth": d})
        position += 1
    body = {"path": normal, "root": root.as_dict(), "depth": depth, "items": items}
    body["truncated"] = more
    if more:
        body["nextCursor"] = make_cursor(listing, offset + limit)
    return body


def find(
    space, path, limit, cursor=None, *, name_contains=None, metadata_key=None,
    metadata_value=None, resource_type=None, caller=None,
) -> dict:  # fmt: skip
    """Entries below ``path`` (any depth) whose name contains ``name_contains`` (case
    insensitive), whose document's metadata has ``metadata_key`` equal to ``metadata_value``
    and whose resource type is ``resource_type``; the ``ls`` page shape."""
    paths.check_path(path)
    limit = check_limit(limit)
    name_contains = _bounded(name_contains, "nameContains", MAX_NAME_FRAGMENT)
    metadata_key = _bounded(metadata_key, "metadataKey", MAX_METADATA_KEY)
    metadata_value = _bounded(metadata_value, "metadataValue", MAX_METADATA_VALUE)
    if (metadata_key is None) != (metadata_value is None):
        raise InvalidInput(
            "metadataKey and metadataValue go together",
            code="invalid_metadata_filter",
            details={"field": "metadataKey" if metadata_key is None else "metadataValue"},
        )
    if resource_type not in (None, "") and resource_type not in RESOURCE_TYPES:
        raise InvalidInput(
            f"resourceType must be one of: {', '.join(RESOURCE_TYPES)}",
            code="invalid_resource_type",
            details={"field": "resourceType"},
        )
    normal = _normal(path)
    evidence.resolve(space, normal, caller)
    listing = listing_id(
        space, "find", normal, limit, name_contains, metadata_key, metadata_value, resource_type,
        caller=caller,
    )  # fmt: skip
    offset = read_cursor(cursor, listing) or 0
    fragment = name_contains.casefold() if name_contains else None

    def matches(entry: Entry) -> bool:
        if fragment and fragment not in entry.name.casefold():
            return False
        if resource_type and entry.resource_type != resource_type:
            return False
        if metadata_key is not None:
            meta = entry.document.document.metadata if entry.document else {}
            if not isinstance(meta, dict) or metadata_key not in meta:
                return False
            value = meta[metadata_key]
            if (value if isinstance(value, str) else json.dumps(value)) != metadata_value:
                return False
        return True

    budget = Budget(limit + 1, SCAN_PAGES)
    found: list[Entry] = []
    position = 0
    for entry, _depth in walk(space, normal, 64, budget, caller):
        if matches(entry):
            if position >= offset:
                found.append(entry)
                if len(found) > limit:
                    break
            position += 1
    if budget.exhausted and len(found) <= limit:
        raise Unavailable(
            f"find read {SCAN_PAGES} pages of {limit + 1} documents without filling a page of "
            f"{limit}; narrow the path or the filters, or raise limit",
            code="fs_scan_budget_exhausted",
            details={"scanned_pages": budget.read, "limit": limit},
        )
    more = len(found) > limit
    next_key = offset + limit if more else None
    return _page(normal, found[:limit], listing, next_key)


def _bounded(value, field: str, limit: int):
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidInput(
            f"{field} must be text of at most {limit} characters",
            code="invalid_filter_value",
            details={"field": field, "limit": limit},
        )
    return value
