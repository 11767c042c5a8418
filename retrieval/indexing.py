"""Which dense indexes a compilation writes into, and the write itself.

The compiler asks :func:`projection_targets` for the space's index versions that must receive
vectors (the active one, and a version being built beside it after an embedding-model change),
embeds the nodes once per target, and hands everything to :func:`index_projections` inside the
transaction that also writes its checkpoint.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from knowledgefs.runtime import EmbeddingModel, get_embedding_model
from retrieval.backends import IndexedNode, get_search_backend


@dataclass(frozen=True)
class ProjectionTarget:
    """One dense index of a space: its version number and the model that fills it."""

    index_version: int
    model: EmbeddingModel


def projection_targets(space_id: uuid.UUID) -> list[ProjectionTarget]:
    """The index versions of ``space_id`` that new nodes must be embedded into (never empty)."""
    return [ProjectionTarget(index_version=1, model=get_embedding_model())]


def index_projections(nodes: list[IndexedNode], vectors: dict[int, np.ndarray]) -> None:
    """Write the keyword projection of ``nodes`` once and their vectors per index version.

    ``vectors`` maps an index version to an array of shape ``(len(nodes), dimension)``. Call
    inside the caller's transaction.
    """
    if not nodes:
        return
    (matrix,) = vectors.values()  # one index version until model changes are supported
    get_search_backend().index_nodes(nodes, matrix, get_embedding_model().model_id)
