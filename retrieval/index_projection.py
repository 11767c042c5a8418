"""The compiler's seam into the index versions: which versions new nodes are embedded into, and
writing their keyword projection and vectors.

- The compiler asks :func:`projection_targets` for the versions that must receive new nodes
  (the active one first, then the building one), embeds the nodes once per target and hands
  everything to :func:`index_projections` inside the transaction that also writes its
  checkpoint. That call re-reads the versions under their row locks, so whatever the compiler
  embedded for a version that was retired meanwhile is dropped, and a version that became active
  meanwhile without being embedded for is embedded on the spot: in-flight work either finishes
  on the old version (and is carried over by the cutover) or lands on the new one.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict

import numpy as np
from django.db import transaction

from ingestion.projection import ProjectionTarget
from knowledgefs.runtime import UnknownEmbeddingModel, get_embedding_model
from retrieval.backends import IndexedNode, get_search_backend
from retrieval.index_versions import _LIVE, _check_dimension, ensure_active_version, live_versions
from retrieval.models import IndexState, IndexVersion
from spaces.models import KnowledgeSpace

logger = logging.getLogger("knowledgefs.indexing")


def projection_targets(space_id: uuid.UUID) -> list[ProjectionTarget]:
    """The index versions of ``space_id`` that new nodes must be embedded into (never empty).

    The active version comes first, then the building one if there is one. A building version
    whose model this process cannot serve is left out (the cutover embeds what it lacks); an
    active model this process cannot serve raises :class:`UnknownEmbeddingModel`.
    """
    active, building = live_versions(space_id)
    if active is None:
        active = ensure_active_version(KnowledgeSpace.objects.get(id=space_id))
    targets = [
        ProjectionTarget(active.number, get_embedding_model(active.model_id, space=space_id))
    ]
    if building is not None:
        try:
            targets.append(
                ProjectionTarget(
                    building.number, get_embedding_model(building.model_id, space=space_id)
                )
            )
        except UnknownEmbeddingModel:
            logger.warning(
                "index v%s of space %s uses %r, which this process does not serve; the rebuild "
                "fills it",
                building.number,
                space_id,
                building.model_id,
            )
    return targets


def index_projections(nodes: list[IndexedNode], vectors: dict[int, np.ndarray]) -> None:
    """Write the keyword projection of ``nodes`` once and their vectors per index version.

    ``vectors`` maps an index version to an array of shape ``(len(nodes), dimension)``. Call
    inside the caller's transaction. The space's live versions are re-read under their row locks
    (the cutover takes the same locks): vectors for a version retired meanwhile are dropped, a
    building version not in ``vectors`` is left to its rebuild, and an active version not in
    ``vectors`` (it became active after the caller asked for its targets) is embedded here. A
    matrix whose dimension differs from its version's raises :class:`ValueError`: one version
    never holds two dimensions.
    """
    if not nodes:
        return
    for number, matrix in vectors.items():
        if matrix.ndim != 2 or matrix.shape[0] != len(nodes):
            raise ValueError(
                f"index v{number}: {len(nodes)} nodes but vectors of shape {matrix.shape}"
            )
    backend = get_search_backend()
    by_space: dict[uuid.UUID, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        by_space[node.space_id].append(i)
    with transaction.atomic():
        writes: list[tuple[list[IndexedNode], np.ndarray, IndexVersion]] = []
        for space_id, rows in by_space.items():
            group = [nodes[i] for i in rows]
            versions = list(
                IndexVersion.objects.select_for_update()
                .filter(space_id=space_id, state__in=_LIVE)
                .order_by("number")
            )
            if not any(v.state == IndexState.ACTIVE for v in versions):
                versions.append(ensure_active_version(KnowledgeSpace(id=space_id)))
            for version in versions:
                found = vectors.get(version.number)
                if found is not None:
                    matrix = found[rows] if len(rows) != len(nodes) else found
                elif version.state == IndexState.BUILDING:
                    continue  # the rebuild and the cutover fill it
                else:
                    logger.warning(
                        "index v%s of space %s became active while %d nodes were embedded for "
                        "other versions; embedding them with %s",
                        version.number,
                        space_id,
                        len(group),
                        version.model_id,
                    )
                    model = get_embedding_model(version.model_id, space=space_id)
                    matrix = model.embed_documents([n.text for n in group])
                _check_dimension(version, matrix)
                writes.append((group, matrix, version))
            skipped = set(vectors) - {v.number for v in versions}
            if skipped:
                logger.info(
                    "space %s: dropped vectors for index versions %s (no longer live)",
                    space_id,
                    sorted(skipped),
                )
        backend.index_keywords(nodes)
        for group, matrix, version in writes:
            backend.index_dense(
                group, matrix, index_version=version.number, model_id=version.model_id
            )


def vectors_for_model(space_id: uuid.UUID, model_id: str, matrix: np.ndarray) -> dict:
    """``{version number: matrix}`` for the live versions of the space filled by ``model_id``.

    For callers that embedded with one model and do not know the version numbers.
    """
    return {
        number: matrix
        for number in IndexVersion.objects.filter(
            space_id=space_id, state__in=_LIVE, model_id=model_id
        ).values_list("number", flat=True)
    }
