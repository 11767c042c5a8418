"""The tree of one space's published documents: entries, document views and path resolution.

Only a document whose active generation is published and which is enabled appears; every path
below it is built from that generation (node ids, section hashes), so a path appears exactly
when its generation is published and disappears with it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property

from django.db.models import F

from ingestion.models import Document, DocumentState, KnowledgeNode, ParseArtifact
from knowledgefs.errors import NotFound

from . import paths

DOCS = "/knowledge/docs"


@dataclass
class Entry:
    """One file or directory. ``resource_type``: ``root``, ``view``, ``document``, ``folder``,
    ``outline``, ``section``, ``table``, ``figure``, ``page``, ``page_text``, ``page_image``."""

    kind: str  # "directory" | "file"
    name: str
    path: str
    resource_type: str
    target_id: str | None = None
    version: str | None = None
    metadata: dict = field(default_factory=dict)
    document: DocumentView | None = None
    payload: object = None  # the section / node / asset / page number the entry stands for

    def as_dict(self) -> dict:
        body = {
            "kind": self.kind,
            "name": self.name,
            "path": self.path,
            "resourceType": self.resource_type,
            "metadata": self.metadata,
        }
        if self.target_id is not None:
            body["targetId"] = self.target_id
        if self.version is not None:
            body["version"] = self.version
        return body


def not_found(path: str) -> NotFound:
    return NotFound(f"{path}: no such path in this space", code="fs_path_not_found")


def published_documents(space):
    """The space's readable documents: published, enabled, with an active generation."""
    return Document.objects.filter(
        space=space,
        state=DocumentState.PUBLISHED,
        enabled=True,
        active_generation__isnull=False,
    )


@dataclass
class Section:
    path: tuple[str, ...]
    name: str
    nodes: list = field(default_factory=list)  # (chunk_index, kind, page) tuples


class DocumentView:
    """One published document at its active generation."""

    def __init__(self, document: Document) -> None:
        self.document = document
        # Only readable documents are viewed: published_documents(), find_document(), or the
        # document of a visible node (its generation is the active one).
        assert document.active_generation is not None
        self.generation: uuid.UUID = document.active_generation
        self.name = paths.document_name(document.filename, document.id)
        self.path = f"{DOCS}/{self.name}"

    def entry(self) -> Entry:
        d = self.document
        return Entry(
            "directory",
            self.name,
            self.path,
            "document",
            str(d.id),
            str(self.generation),
            {
                "filename": d.filename,
                "mimeType": d.mime_type,
                "sizeBytes": d.size_bytes,
                "sha256": d.sha256,
                "nodeCount": d.node_count,
                "documentMetadata": d.metadata,
            },
            self,
        )

    # --- what the generation holds ------------------------------------------------------
    @cached_property
    def node_rows(self) -> list[tuple]:
        """``(id, chunk_index, kind, page_number, section_path, start, end)`` in order; the
        text chunks only (an image's description is no part of the document's text)."""
        return list(
            KnowledgeNode.objects.filter(document=self.document, generation=self.generation)
            .exclude(kind="image")
            .order_by("chunk_index")
            .values_list(
                "id", "chunk_index", "kind", "page_number", "section_path", "start_offset",
                "end_offset",
            )
        )  # fmt: skip

    @cached_property
    def artifact(self) -> ParseArtifact | None:
        return (
            ParseArtifact.objects.filter(job_id=self.generation)
            .only("id", "parser", "artifact_hash", "page_count", "assets", "warnings", "job_id")
            .first()
        )

    @cached_property
    def sections(self) -> list[Section]:
        found: dict[tuple, Section] = {}
        for row in self.node_rows:
            if row[2] == "table":
                continue
            key = tuple(row[4] or ())
            if key not in found:
                found[key] = Section(key, paths.section_name(self.generation, key))
            found[key].nodes.append(row)
        return list(found.values())

    @cached_property
    def tables(self) -> list[tuple[str, tuple]]:
        rows = [r for r in self.node_rows if r[2] == "table"]
        return [(f"table-{i}--{r[0].hex[:8]}.md", r) for i, r in enumerate(rows, 1)]

    @cached_property
    def figures(self) -> list[tuple[str, dict]]:
        assets = self.artifact.assets if self.artifact else []
        images = [a for a in assets if a.get("kind") == "image"]
        return [
            (f"figure-{i}--{paths.short_hash(str(self.generation), a['key'])}.json", a)
            for i, a in enumerate(images, 1)
        ]

    @cached_property
    def pages(self) -> list[int]:
        numbers = {r[3] for r in self.node_rows if r[3] is not None}
        if self.artifact:
            numbers |= {a["page_number"] for a in self.artifact.assets if a.get("page_number")}
        return sorted(numbers)

    def page_assets(self, number: int) -> list[tuple[str, dict]]:
        assets = self.artifact.assets if self.artifact else []
        out = []
        for kind, name in (("page_image", "image.json"), ("thumbnail", "thumbnail.json")):
            found = [a for a in assets if a.get("kind") == kind and a.get("page_number") == number]
            if found:
                out.append((name, found[0]))
        return out

    # --- the entries ----------------------------------------------------------------------
    def _file(self, rel: str, resource_type: str, target, payload, metadata=None) -> Entry:
        name = rel.rsplit("/", 1)[-1]
        return Entry(
            "file", name, f"{self.path}/{rel}", resource_type, target, str(self.generation),
            metadata or {}, self, payload,
        )  # fmt: skip

    def _dir(self, rel: str, resource_type: str = "folder", payload=None) -> Entry:
        name = rel.rsplit("/", 1)[-1]
        return Entry(
            "directory", name, f"{self.path}/{rel}", resource_type, None, str(self.generation),
            {}, self, payload,
        )  # fmt: skip

    def children(self, rel: list[str]) -> list[Entry]:
        """The entries directly under ``rel`` (segments below the document folder), sorted by
        name; :func:`not_found` when ``rel`` is not a directory of this document."""
        if not rel:
            out = [self._file("outline.json", "outline", str(self.document.id), None)]
            out.append(self._dir("sections"))
            if self.tables:
                out.append(self._dir("tables"))
            if self.figures:
                out.append(self._dir("figures"))
            if self.pages:
                out.append(self._dir("pages"))
            return out
        head = rel[0]
        if rel == ["sections"]:
            return sorted(
                (
                    self._file(
                        f"sections/{s.name}", "section", str(s.nodes[0][0]), s,
                        {"sectionPath": list(s.path), "nodeCount": len(s.nodes)},
                    )
                    for s in self.sections
                ),
                key=lambda e: e.name,
            )  # fmt: skip
        if rel == ["tables"] and self.tables:
            return [
                self._file(f"tables/{n}", "table", str(r[0]), r, {"sectionPath": list(r[4])})
                for n, r in self.tables
            ]
        if rel == ["figures"] and self.figures:
            return [
                self._file(
                    f"figures/{n}", "figure", a.get("sha256"), a,
                    {"pageNumber": a.get("page_number"), "mimeType": a.get("mime_type")},
                )
                for n, a in self.figures
            ]  # fmt: skip
        if rel == ["pages"] and self.pages:
            return [self._dir(f"pages/{n}", "page", n) for n in self.pages]
        if head == "pages" and len(rel) == 2 and rel[1].isdigit() and int(rel[1]) in self.pages:
            number = int(rel[1])
            out = [
                self._file(f"pages/{number}/{name}", "page_image", a.get("sha256"), a)
                for name, a in self.page_assets(number)
            ]
            out.append(self._file(f"pages/{number}/text.md", "page_text", None, number))
            return sorted(out, key=lambda e: e.name)
        raise not_found(f"{self.path}/{'/'.join(rel)}")

    def resolve(self, rel: list[str]) -> Entry:
        if not rel:
            return self.entry()
        parent = rel[:-1]
        for child in self.children(parent):
            if child.name == rel[-1]:
                return child
        raise not_found(f"{self.path}/{'/'.join(rel)}")

    def walk(self, rel: list[str] | None = None):
        """Every entry below ``rel``, depth first in name order."""
        for child in self.children(rel or []):
            yield child
            if child.kind == "directory":
                yield from self.walk(child.path[len(self.path) + 1 :].split("/"))


def find_document(space, name: str) -> DocumentView:
    """The published document whose folder is ``name`` (``<slug>--<8hex>``), else 404."""
    prefix = name.rsplit("--", 1)[-1] if "--" in name else ""
    if len(prefix) != 8 or any(c not in "0123456789abcdef" for c in prefix):
        raise not_found(f"{DOCS}/{name}")
    # the ids whose hex starts with the prefix are one range of the primary key
    # (alone: the planner then walks the primary key, not the space's documents); readability
    # is checked on the few rows found
    low, high = uuid.UUID(prefix + "0" * 24), uuid.UUID(prefix + "f" * 24)
    candidates = Document.objects.filter(id__gte=low, id__lte=high).order_by("id")
    for document in candidates[:64]:
        readable = (
            document.space_id == space.id
            and document.state == DocumentState.PUBLISHED
            and document.enabled
            and document.active_generation is not None
        )
        if readable and DocumentView(document).name == name:
            return DocumentView(document)
    raise not_found(f"{DOCS}/{name}")


ROOT_ENTRIES = {
    "/": [("knowledge", "root"), ("evidence", "root"), ("sources", "root"), ("workspaces", "root")],
    "/knowledge": [("docs", "view")],
}


def fixed_entry(path: str) -> Entry | None:
    if path == "/":
        return Entry("directory", "/", "/", "root")
    for parent, children in ROOT_ENTRIES.items():
        for name, kind in children:
            full = (parent.rstrip("/") + "/" + name) if parent != "/" else "/" + name
            if full == path:
                return Entry("directory", name, full, kind)
    return None


def fixed_children(path: str) -> list[Entry] | None:
    """The children of a fixed directory (``/``, ``/knowledge``, and the reserved roots, which
    are empty); ``None`` for any other path (``/evidence`` lists traces: :mod:`.evidence`)."""
    if path in ("/sources", "/workspaces"):
        return []
    if path not in ROOT_ENTRIES:
        return None
    base = "" if path == "/" else path
    return [Entry("directory", n, f"{base}/{n}", k) for n, k in ROOT_ENTRIES[path]]


def split_document(segments: list[str]) -> tuple[str, list[str]] | None:
    """``(folder name, rest)`` when ``segments`` lie inside ``/knowledge/docs/<name>``."""
    if len(segments) >= 3 and segments[0] == "knowledge" and segments[1] == "docs":
        return segments[2], segments[3:]
    return None


def resolve(space, path: str) -> Entry:
    """The entry at ``path`` (already checked by :func:`paths.check_path`), else 404; below
    ``/evidence`` nothing (:func:`.evidence.resolve` resolves those for a caller)."""
    segments = [s for s in path.split("/") if s]
    normal = "/" + "/".join(segments)
    fixed = fixed_entry(normal)
    if fixed is not None:
        return fixed
    if normal == DOCS:
        return Entry("directory", "docs", DOCS, "view")
    inside = split_document(segments)
    if inside is None:
        raise not_found(normal)
    name, rest = inside
    return find_document(space, name).resolve(rest)


def node_path(view: DocumentView, row: tuple) -> str:
    """The file a node's text appears in: its section, or its table."""
    if row[2] == "table":
        for name, r in view.tables:
            if r[0] == row[0]:
                return f"{view.path}/tables/{name}"
    key = tuple(row[4] or ())
    return f"{view.path}/sections/{paths.section_name(view.generation, key)}"


def visible_node(space, node_id) -> KnowledgeNode | None:
    try:
        ident = uuid.UUID(str(node_id))
    except ValueError:
        return None
    return (
        KnowledgeNode.objects.filter(
            id=ident,
            space=space,
            generation=F("document__active_generation"),
            document__enabled=True,
            document__state=DocumentState.PUBLISHED,
        )
        .select_related("document")
        .first()
    )
