"""Retrieval's implementation of ingestion's projection port (:mod:`ingestion.projection`).

Each operation delegates to the index-version functions (:mod:`retrieval.index_projection`,
:mod:`retrieval.index_versions`) or to the
search backend (:func:`retrieval.backends.get_search_backend`), looked up when called. Registered
by ``RetrievalConfig.ready()``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import numpy as np
from django.db import connection

from ingestion.projection import IndexedNode, ProjectionTarget
from retrieval import backends, index_projection, index_versions

logger = logging.getLogger("knowledgefs.retrieval")


class SearchProjector:
    """Projections of knowledge nodes in the index versions and the search backend."""

    def targets(self, space_id: uuid.UUID) -> list[ProjectionTarget]:
        """:func:`retrieval.index_projection.projection_targets`."""
        return index_projection.projection_targets(space_id)

    def write(self, nodes: list[IndexedNode], vectors: dict[int, np.ndarray]) -> None:
        """:func:`retrieval.index_projection.index_projections`."""
        index_projection.index_projections(nodes, vectors)

    def remover(self) -> Callable[[list[uuid.UUID]], None]:
        """The search backend's ``delete_nodes`` (resolving the backend raises now)."""
        return backends.get_search_backend().delete_nodes

    def delete(self, node_ids: list[uuid.UUID]) -> None:
        """The search backend's ``delete_nodes``."""
        backends.get_search_backend().delete_nodes(node_ids)

    def recover_builds(self) -> int:
        """:func:`retrieval.index_versions.recover_index_builds` (0 where it does not exist);
        on SQLite also :func:`retrieval.keyword_index.maintenance.heal` (keyword indexes that
        are unusable or behind the database are rebuilt; logged, not counted)."""
        recover = getattr(index_versions, "recover_index_builds", None)
        count = recover() if recover else 0
        if connection.vendor == "sqlite" and backends.backend_name() == "database":
            from retrieval.keyword_index import maintenance

            healed = maintenance.heal()
            if healed:
                logger.info("recovery sweep: %d keyword indexes rebuilt", healed)
        return count
