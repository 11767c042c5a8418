"""Keeping the keyword indexes whole: verification, rebuilds from the database, healing.

The database is the source of truth: every node of a space (all generations, as the compiler
projected them) is one document of the space's index. A published node missing from the index
cannot be found by the keyword leg, so:

- :func:`problem` names what is wrong with one space's index (missing while the space has
  published nodes, an unreadable ``meta.json`` or marker, an open error); ``/ready`` and the
  start-up check report it, and queries on that space answer 503;
- :func:`behind` compares the index's document count with the database: fewer documents than
  the space's published nodes means a write was lost (a crash between an index commit and the
  database commit of a delete, a database restored from a backup newer than the index);
- :func:`rebuild` (``kfs reindex``) writes a new index from the database and swaps it in;
- :func:`heal` (the recovery sweep) rebuilds every index that has a problem or is behind.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable

from django.db.models import F

from ingestion.models import KnowledgeNode
from retrieval.text import keyword_text
from spaces.models import KnowledgeSpace

from . import analysis, store

logger = logging.getLogger("knowledgefs.retrieval")

PROGRESS_EVERY = 1000


def has_published_nodes(space_id: uuid.UUID) -> bool:
    """Whether any node of the space belongs to its document's published generation."""
    return KnowledgeNode.objects.filter(
        space_id=space_id, generation=F("document__active_generation")
    ).exists()


def published_count(space_id: uuid.UUID) -> int:
    """The space's nodes of published generations (each must be in the index)."""
    return KnowledgeNode.objects.filter(
        space_id=space_id, generation=F("document__active_generation")
    ).count()


def problem(space_id: uuid.UUID) -> str | None:
    """What makes the space's index unusable, ``None`` when it is fine (or not needed yet).

    Reads ``kfs.json`` and ``meta.json`` each time (a file damaged under an open index is
    seen) and opens the index when this process has not yet.
    """
    path = store.current_path(space_id)
    if path is None:
        if has_published_nodes(space_id):
            return "index directory missing"
        return None
    name = "index"
    try:
        for name in (store.MARKER, "meta.json"):
            json.loads((path / name).read_text())
        store.open_index(space_id, head=-1)
    except store.KeywordIndexUnavailable as exc:
        return exc.problem
    except (OSError, ValueError) as exc:
        store.forget(space_id)
        return f"{name} unreadable: {type(exc).__name__}"
    return None


def problems() -> dict[uuid.UUID, str]:
    """``{space id: problem}`` over every space that is not being deleted."""
    found = {}
    for space_id in KnowledgeSpace.objects.filter(deleting_at__isnull=True).values_list(
        "id", flat=True
    ):
        issue = problem(space_id)
        if issue is not None:
            found[space_id] = issue
    return found


def behind(space_id: uuid.UUID) -> bool:
    """Whether the index holds fewer documents than the space has published nodes."""
    return store.num_docs(space_id) < published_count(space_id)


def rebuild(space_id: uuid.UUID, *, on_progress: Callable[[int, int], None] | None = None) -> int:
    """Write a new index of the space from the database and swap it in; returns its documents.

    Every node of the space is added (all generations: what the compiler projected). Writers
    wait meanwhile (:func:`store.rebuilding`); ``on_progress(done, total)`` is called every
    :data:`PROGRESS_EVERY` nodes and at the end.
    """
    nodes = KnowledgeNode.objects.filter(space_id=space_id)
    total = nodes.count()
    done = 0
    with store.rebuilding(space_id) as w:
        for node_id, document_id, text in nodes.values_list("id", "document_id", "text").iterator(
            chunk_size=2000
        ):
            w.add_document(analysis.document(node_id, document_id, keyword_text(text)))
            done += 1
            if on_progress and done % PROGRESS_EVERY == 0:
                on_progress(done, total)
    if on_progress:
        on_progress(done, total)
    logger.info("keyword index of space %s rebuilt: %d documents", space_id, done)
    return done


def spaces_to_reindex(
    space: str | None = None, *, tenant: str | None = None, every: bool = False
) -> list[KnowledgeSpace]:
    """The spaces ``kfs reindex`` names: ``every`` space not being deleted, or one by id, or by
    slug (with ``tenant`` when two tenants use the slug). Raises :class:`NotFound`
    (``space_not_found``) or :class:`InvalidInput` (``ambiguous_space``)."""
    from knowledgefs.errors import InvalidInput, NotFound

    live = KnowledgeSpace.objects.filter(deleting_at__isnull=True).order_by("tenant_id", "slug")
    if every:
        return list(live)
    try:
        by_id = list(live.filter(id=uuid.UUID(space)))
    except (TypeError, ValueError):
        by_id = []
    found = by_id or list(live.filter(slug=space, **({"tenant_id": tenant} if tenant else {})))
    if not found:
        raise NotFound(f"no space {space!r}", code="space_not_found")
    if len(found) > 1:
        raise InvalidInput(
            f"the slug {space!r} is used by {len(found)} tenants; add --tenant or pass the id",
            code="ambiguous_space",
        )
    return found


def heal() -> int:
    """Rebuild every space's index that has a :func:`problem` or is :func:`behind`; returns how
    many were rebuilt. A rebuild that fails (the index is busy) is logged and left to the next
    sweep."""
    from retrieval.backends.base import SearchBackendError

    rebuilt = 0
    for space_id in KnowledgeSpace.objects.filter(deleting_at__isnull=True).values_list(
        "id", flat=True
    ):
        issue = problem(space_id)
        if issue is None and store.current_path(space_id) is None:
            continue  # nothing published, nothing to index
        if issue is None and not behind(space_id):
            continue
        logger.warning(
            "keyword index of space %s: %s; rebuilding", space_id, issue or "behind the database"
        )
        try:
            rebuild(space_id)
        except SearchBackendError as exc:
            logger.warning("keyword index of space %s not rebuilt: %s", space_id, exc)
            continue
        rebuilt += 1
    return rebuilt
