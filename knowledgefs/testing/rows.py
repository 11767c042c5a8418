"""Rows for tests and benchmarks that load a space directly (no compilation): an unsaved
published :class:`~ingestion.models.Document` with the fields its constraints need."""

from __future__ import annotations

import hashlib
import uuid

from ingestion.models import Document, DocumentState
from spaces.models import KnowledgeSpace


def published_document(
    space: KnowledgeSpace,
    name: str,
    *,
    generation: uuid.UUID,
    node_count: int,
    enabled: bool = True,
    size_bytes: int = 10,
    prefix: str = "test",
) -> Document:
    """An unsaved published document ``<name>.txt`` of ``space`` whose active generation is
    ``generation``; its sha256 and storage key are unique per ``(space, name)``."""
    return Document(
        tenant_id=space.tenant_id,
        space=space,
        filename=f"{name}.txt",
        mime_type="text/plain",
        size_bytes=size_bytes,
        sha256=hashlib.sha256(f"{space.id}:{name}".encode()).hexdigest(),
        storage_key=f"{prefix}/{space.id}/{name}",
        state=DocumentState.PUBLISHED,
        active_generation=generation,
        node_count=node_count,
        enabled=enabled,
    )
