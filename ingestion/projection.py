"""The projection port: how ingestion writes and removes the search projections of its nodes.

Ingestion owns this port and never imports retrieval. Retrieval implements it
(:class:`retrieval.projector.SearchProjector`) and registers the implementation in
``RetrievalConfig.ready()``; :func:`projector` returns it, and raises :class:`RuntimeError`
while nothing is registered (the retrieval app is not installed or not ready yet).

The operations (see :class:`Projector`) keep the semantics of the retrieval functions they
stand for: ``targets`` names the index versions new nodes must be embedded into, ``write``
runs inside the caller's transaction (the one that writes the checkpoint), ``delete`` removes
nodes from every projection, and a failure of the search store is raised as a
:class:`ProjectionError` carrying its stable code and retry class.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from knowledgefs.runtime import EmbeddingModel


@dataclass(frozen=True)
class IndexedNode:
    """What a backend needs to index one node."""

    id: uuid.UUID
    space_id: uuid.UUID
    document_id: uuid.UUID
    text: str


@dataclass(frozen=True)
class ProjectionTarget:
    """One dense index of a space: its version number and the model that fills it."""

    index_version: int
    model: EmbeddingModel


class ProjectionError(Exception):
    """The search store failed: a stable ``code``, a ``message`` and ``retryable`` (a later
    attempt may succeed; a compilation then retries). Retrieval's ``SearchBackendError``
    subclasses it, so ingestion catches backend failures through the port."""

    code = "projection_failed"
    retryable = True

    def __init__(
        self, message: str = "", *, code: str | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable


class Projector(Protocol):
    """The operations ingestion needs from the search projections."""

    def targets(self, space_id: uuid.UUID) -> list[ProjectionTarget]:
        """The index versions new nodes of ``space_id`` are embedded into (never empty)."""

    def write(self, nodes: list[IndexedNode], vectors: dict[int, np.ndarray]) -> None:
        """Index ``nodes``: keyword projection once, ``vectors[index_version]`` of shape
        ``(len(nodes), dimension)`` per version; inside the caller's transaction."""

    def remover(self) -> Callable[[list[uuid.UUID]], None]:
        """The function that removes nodes (by id) from every projection, resolved now: it
        raises at once when this process has no search store."""

    def delete(self, node_ids: list[uuid.UUID]) -> None:
        """Remove these nodes from every projection (``remover()(node_ids)``)."""

    def recover_builds(self) -> int:
        """Re-enqueue stalled index builds (the recovery sweep); returns how many."""


_registered: Projector | None = None


def register(implementation: Projector) -> None:
    """Install the projector (called once from ``RetrievalConfig.ready()``)."""
    global _registered
    _registered = implementation


def projector() -> Projector:
    """The registered projector; :class:`RuntimeError` when none is registered."""
    if _registered is None:
        raise RuntimeError(
            "no projector is registered: ingestion.projection needs the retrieval app "
            "(RetrievalConfig.ready() registers retrieval.projector.SearchProjector)"
        )
    return _registered
