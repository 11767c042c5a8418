"""Retrieval's implementation of ingestion's projection port (:mod:`ingestion.projection`).

Each operation delegates to the index-version functions of :mod:`retrieval.indexing` or to the
search backend (:func:`retrieval.backends.get_search_backend`), looked up when called. Registered
by ``RetrievalConfig.ready()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np

from ingestion.projection import IndexedNode, ProjectionTarget
from retrieval import backends, indexing


class SearchProjector:
    """Projections of knowledge nodes in the index versions and the search backend."""

    def targets(self, space_id: uuid.UUID) -> list[ProjectionTarget]:
        """:func:`retrieval.indexing.projection_targets`."""
        return indexing.projection_targets(space_id)

    def write(self, nodes: list[IndexedNode], vectors: dict[int, np.ndarray]) -> None:
        """:func:`retrieval.indexing.index_projections`."""
        indexing.index_projections(nodes, vectors)

    def remover(self) -> Callable[[list[uuid.UUID]], None]:
        """The search backend's ``delete_nodes`` (resolving the backend raises now)."""
        return backends.get_search_backend().delete_nodes

    def delete(self, node_ids: list[uuid.UUID]) -> None:
        """The search backend's ``delete_nodes``."""
        backends.get_search_backend().delete_nodes(node_ids)

    def recover_builds(self) -> int:
        """:func:`retrieval.indexing.recover_index_builds` (0 where it does not exist)."""
        recover = getattr(indexing, "recover_index_builds", None)
        return recover() if recover else 0
