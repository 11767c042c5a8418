"""``cat``, ``stat``, ``diff`` and ``open_node``: the content of one path.

Text is rebuilt from the published nodes (their half-open offsets into the canonical text; the
overlap between neighbours is taken once), so what ``cat`` shows is exactly what retrieval
cites. ``cat`` pages long text by characters with a signed cursor.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import TYPE_CHECKING

from ingestion.models import KnowledgeNode
from knowledgefs.errors import InvalidInput, NotFound

from . import evidence, listing, paths, tree
from .tree import DocumentView, Entry

if TYPE_CHECKING:
    from ingestion.parsing import Element

DEFAULT_PAGE_CHARS = 16_384
MAX_PAGE_CHARS = 65_536
MAX_DIFF_CHARS = 262_144
MAX_DIFF_OPERATIONS = 1_000


def merged_text(view: DocumentView, rows: list[tuple]) -> str:
    """The canonical text covered by ``rows`` (node rows of one document), overlaps taken
    once, gaps between non-adjacent nodes as one newline; fenced code (kept by the parser
    without its fence lines) is shown inside its fence again, opened where the code starts and
    closed where it ends within the text shown (case BC-39)."""
    if not rows:
        return ""
    texts = dict(
        KnowledgeNode.objects.filter(id__in=[r[0] for r in rows]).values_list("id", "text")
    )
    segments: list[tuple[int, str]] = []  # (canonical offset of the text, text)
    end = None
    for row in sorted(rows, key=lambda r: (r[5], r[6])):
        start, stop, text = row[5], row[6], texts.get(row[0], "")
        if end is None or start >= end:
            segments.append((start, text))
        elif stop > end:
            segments.append((end, text[end - start :]))
        end = stop if end is None else max(end, stop)
    fences = _fences(view, [(a, a + len(t)) for a, t in segments])
    out: list[str] = []
    previous_end, placed = None, 0
    for a, text in segments:
        if previous_end is not None and a != previous_end:
            out.append("\n")
        pos = a
        while placed < len(fences) and fences[placed][0] <= a + len(text):
            at, line = fences[placed]
            at = max(at, pos)
            out += [text[pos - a : at - a], line]
            pos, placed = at, placed + 1
        out.append(text[pos - a :])
        previous_end = a + len(text)
    return "".join(out)


def _fences(view: DocumentView, spans: list[tuple[int, int]]) -> list[tuple[int, str]]:
    """``(canonical offset, fence line)`` to insert for each code element meeting ``spans``:
    the opening fence (with the info string) at its start or the first shown character, the
    closing fence at its end or the last; ascending."""
    from ingestion.chunk_metadata import fence_for

    out: list[tuple[int, str]] = []
    for start, end, element in _elements(view, "code"):
        shown = [(max(a, start), min(b, end)) for a, b in spans if a < end and b > start]
        if not shown:
            continue
        code = element.text.strip()
        opening, closing = fence_for(code, (element.metadata or {}).get("language"))
        out.append((shown[0][0], opening + "\n"))
        out.append((shown[-1][1], "\n" + closing))
    return sorted(out, key=lambda item: item[0])


def render(space, entry: Entry) -> tuple[str, str, dict]:
    """``(content type, text, extra members)`` of a file entry."""
    view = entry.document
    if entry.resource_type in ("trace_query", "evidence_item"):
        return "application/json", evidence.render(space, entry), {}
    if view is None:  # a fixed or evidence directory: every other file is a document's
        raise InvalidInput(f"{entry.path} is a directory", code="fs_is_directory")
    if entry.resource_type == "outline":
        return "application/json", json.dumps(outline(view), ensure_ascii=False, indent=1), {}
    if entry.resource_type == "section":
        section = entry.payload
        assert isinstance(section, tree.Section)  # DocumentView.children() set it
        heading = " / ".join(section.path)
        text = merged_text(view, section.nodes)
        return "text/markdown", (f"# {heading}\n\n{text}" if heading else text), {}
    if entry.resource_type == "table":
        row = entry.payload
        assert isinstance(row, tuple)  # DocumentView.children(): the table's node row
        table = _table_elements(view, row)
        text = "\n\n".join(_markdown_table(t) for t in table) or merged_text(view, [row])
        return "text/markdown", text, {"table": table}
    if entry.resource_type in ("figure", "page_image"):
        asset = entry.payload
        assert isinstance(asset, dict)  # DocumentView.children(): the asset record
        descriptor = {
            "objectKey": asset.get("key"),
            "kind": asset.get("kind"),
            "name": asset.get("name"),
            "pageNumber": asset.get("page_number"),
            "mimeType": asset.get("mime_type"),
            "width": asset.get("width"),
            "height": asset.get("height"),
            "sizeBytes": asset.get("bytes"),
            "sha256": asset.get("sha256"),
        }
        return "application/json", json.dumps(descriptor, indent=1), {}
    if entry.resource_type == "page_text":
        rows = [r for r in view.node_rows if r[3] == entry.payload]
        return "text/markdown", merged_text(view, rows), {}
    raise InvalidInput(f"{entry.path} is a directory", code="fs_is_directory")


def _elements(view: DocumentView, kind: str) -> list[tuple[int, int, Element]]:
    """``(start, end, element)`` of the generation's parsed elements of type ``kind``, their
    ranges in the canonical text (read from the parse artifact)."""
    from ingestion.chunking import canonical_text
    from ingestion.models import ParseArtifact
    from ingestion.parsing import Element

    artifact = ParseArtifact.objects.filter(job_id=view.generation).only("elements").first()
    if artifact is None or not any(e.get("type") == kind for e in artifact.elements):
        return []
    elements = [
        Element(**{**e, "section_path": tuple(e.get("section_path") or ())})
        for e in artifact.elements
    ]
    kept = [e for e in elements if e.text.strip()]
    _text, spans = canonical_text(elements)
    return [
        (start, end, element)
        for element, (start, end) in zip(kept, spans, strict=True)
        if element.type == kind
    ]


def _table_elements(view: DocumentView, row: tuple) -> list[dict]:
    """The parsed tables (``{header, rows}``) inside a table node's range of the canonical
    text, read from the generation's parse artifact."""
    out = []
    for start, end, element in _elements(view, "table"):
        if start < row[6] and end > row[5]:
            meta = element.metadata or {}
            out.append({"header": meta.get("header"), "rows": meta.get("rows") or []})
    return out


def _markdown_table(table: dict) -> str:
    rows = [list(map(_cell, r)) for r in table["rows"]]
    width = max([len(table["header"] or [])] + [len(r) for r in rows] + [1])
    header = list(map(_cell, table["header"] or [""] * width))
    header += [""] * (width - len(header))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
    return "\n".join(lines)


def _cell(value) -> str:
    return re.sub(r"\s+", " ", str(value if value is not None else "")).replace("|", "\\|")


def outline(view: DocumentView) -> dict:
    d = view.document
    return {
        "documentId": str(d.id),
        "filename": d.filename,
        "generation": str(view.generation),
        "path": view.path,
        "sections": [
            {
                "path": f"{view.path}/sections/{s.name}",
                "sectionPath": list(s.path),
                "pages": sorted({r[3] for r in s.nodes if r[3] is not None}),
                "nodeIds": [str(r[0]) for r in s.nodes],
            }
            for s in view.sections
        ],
        "tables": [f"{view.path}/tables/{n}" for n, _ in view.tables],
        "figures": [f"{view.path}/figures/{n}" for n, _ in view.figures],
        "pages": view.pages,
    }


def _file(space, path, caller=None) -> Entry:
    paths.check_path(path)
    entry = evidence.resolve(space, listing._normal(path), caller)
    if entry.kind != "file":
        raise InvalidInput(
            f"{entry.path} is a directory; use ls or tree", code="fs_is_directory",
            details={"field": "path"},
        )  # fmt: skip
    return entry


def cat(space, path, limit=None, cursor=None, caller=None) -> dict:
    """A page of a file's rendered content: ``limit`` characters (1..65,536, default 16,384)
    from the cursor's offset; ``nextCursor`` while more remains."""
    entry = _file(space, path, caller)
    size = _page_chars(limit)
    content_type, text, extra = render(space, entry)
    listing_key = listing.listing_id(space, "cat", entry.path, size, entry.version, caller=caller)
    start = listing.read_cursor(cursor, listing_key) or 0
    chunk = text[start : start + size]
    more = start + size < len(text)
    body = {
        "path": entry.path,
        "contentType": content_type,
        "text": chunk,
        "offset": start,
        "totalChars": len(text),
        "truncated": more,
        **extra,
    }
    if more:
        body["nextCursor"] = listing.make_cursor(listing_key, start + size)
    return body


def _page_chars(limit) -> int:
    if limit in (None, ""):
        return DEFAULT_PAGE_CHARS
    number = listing._integer(limit)
    if number is None or not 1 <= number <= MAX_PAGE_CHARS:
        raise InvalidInput(
            f"limit (characters per page of cat) must be an integer from 1 to {MAX_PAGE_CHARS}",
            code="invalid_limit",
            details={"field": "limit", "min": 1, "max": MAX_PAGE_CHARS},
        )
    return number


def stat(space, path, caller=None) -> dict:
    """Metadata of a path; files add the sha256 and UTF-8 size of their rendered content."""
    paths.check_path(path)
    entry = evidence.resolve(space, listing._normal(path), caller)
    body: dict[str, object] = {
        "path": entry.path,
        "kind": entry.kind,
        "resourceType": entry.resource_type,
        "targetId": entry.target_id,
        "version": entry.version,
        "metadata": entry.metadata,
    }
    view = entry.document
    if view is not None:
        artifact = view.artifact
        body["parserStatus"] = {
            "state": view.document.state,
            "parser": artifact.parser if artifact else None,
            "artifactHash": artifact.artifact_hash if artifact else None,
            "warnings": list(artifact.warnings) if artifact else [],
        }
        body["documentId"] = str(view.document.id)
    if entry.resource_type == "document":
        assert view is not None  # DocumentView.entry()
        body.update(
            contentType=view.document.mime_type,
            sha256=view.document.sha256,
            sizeBytes=view.document.size_bytes,
        )
    elif entry.kind == "file":
        content_type, text, _ = render(space, entry)
        data = text.encode()
        body.update(
            contentType=content_type, sha256=hashlib.sha256(data).hexdigest(), sizeBytes=len(data)
        )
    return body


def diff(space, old_path, new_path, mode=None) -> dict:
    """Line or word differences between two files' rendered content (each at most 256 KiB
    characters; at most 1,000 operations, then ``truncated``)."""
    mode = mode or "line"
    if mode not in ("line", "word"):
        raise InvalidInput(
            "mode must be line or word", code="invalid_diff_mode", details={"field": "mode"}
        )
    texts = []
    for field, path in (("oldPath", old_path), ("newPath", new_path)):
        paths.check_path(path, field)
        entry = _file(space, path)
        text = render(space, entry)[1]
        if len(text) > MAX_DIFF_CHARS:
            raise InvalidInput(
                f"{field} has {len(text)} characters; diff compares at most {MAX_DIFF_CHARS}",
                code="diff_too_large",
                details={"field": field, "limit": MAX_DIFF_CHARS},
            )
        texts.append(text)
    split = (
        (lambda t: t.splitlines(keepends=True))
        if mode == "line"
        else (lambda t: re.findall(r"\S+|\s+", t))
    )
    old, new = split(texts[0]), split(texts[1])
    operations: list[dict] = []
    stats = {"equal": 0, "insert": 0, "delete": 0}
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        parts: list[tuple[str, str, int | None, int | None, int | None, int | None]] = []
        if tag == "equal":
            parts.append(("equal", "".join(old[i1:i2]), i1, i2, j1, j2))
        if tag in ("delete", "replace"):
            parts.append(("delete", "".join(old[i1:i2]), i1, i2, None, None))
        if tag in ("insert", "replace"):
            parts.append(("insert", "".join(new[j1:j2]), None, None, j1, j2))
        for kind, text, a, b, c, d in parts:
            stats[kind] += 1
            op: dict[str, object] = {"kind": kind, "text": text}
            if a is not None:
                op.update(oldStart=a, oldEnd=b)
            if c is not None:
                op.update(newStart=c, newEnd=d)
            operations.append(op)
    truncated = len(operations) > MAX_DIFF_OPERATIONS
    return {
        "mode": mode,
        "oldPath": listing._normal(old_path),
        "newPath": listing._normal(new_path),
        "operations": operations[:MAX_DIFF_OPERATIONS],
        "stats": stats,
        "truncated": truncated,
    }


def open_node(space, node_id) -> dict:
    """The node and its citation exactly as retrieval gives it (:func:`retrieval.recall.hydrate`);
    404 ``node_not_found`` for a node of another space, an unpublished generation or a disabled
    document."""
    from ..recall import hydrate

    if not node_id:
        raise InvalidInput(
            "nodeId is required", code="invalid_node_id", details={"field": "nodeId"}
        )
    node = tree.visible_node(space, node_id)
    if node is None:
        raise NotFound("node not found in this space", code="node_not_found")
    item = hydrate([(node.id, 0.0, {})])[0]
    view = DocumentView(node.document)
    row = (
        node.id, node.chunk_index, node.kind, node.page_number, node.section_path,
        node.start_offset, node.end_offset,
    )  # fmt: skip
    return {
        "citation": item.citation,
        "node": {
            "id": str(node.id),
            "text": node.text,
            "kind": node.kind,
            "chunkIndex": node.chunk_index,
            "generation": str(node.generation),
            "path": tree.node_path(view, row),
        },
    }
