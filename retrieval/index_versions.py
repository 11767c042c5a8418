"""Index versions and their lifecycle: reading them, a space's first one, changing the model,
retiring, purging and recovering stalled builds.

Every dense vector belongs to an :class:`~retrieval.models.IndexVersion` of its space: one
embedding model, one dimension. A space has one ``active`` version (queries use it) and, after
its embedding model is changed, one ``building`` version filled beside it:

- :func:`ensure_active_version` creates a space's version 1 (from its embedding profile).
- :func:`change_embedding_model` creates the building version and enqueues its rebuild
  (``retrieval.tasks.rebuild_index``, :func:`retrieval.index_builds.rebuild_index_version`);
  queries keep using the active version until :func:`retrieval.index_builds.cutover`.
- A retired version's vectors are deleted after the commit that retired it
  (:func:`purge_retired_vectors`); :func:`recover_index_builds` re-enqueues building versions
  without progress and finishes interrupted purges.

One version never holds two dimensions (:func:`_check_dimension`, used by every writer).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import numpy as np
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from knowledgefs.db import lock_for_update
from knowledgefs.errors import InvalidInput
from knowledgefs.runtime import (
    EmbeddingModel,
    UnknownEmbeddingModel,
    get_embedding_model,
    registered_model_ids,
    runtime_name,
)
from retrieval.backends import backend_name, get_search_backend
from retrieval.models import DenseVector, IndexState, IndexVersion
from spaces.models import KnowledgeSpace

logger = logging.getLogger("knowledgefs.indexing")

STALL_SECONDS = 600  # a building version without progress for this long is re-enqueued
PURGE_BATCH = 1000
_LIVE = (IndexState.ACTIVE, IndexState.BUILDING)


# --- reading versions -------------------------------------------------------------------------


def resolve_model(model_id: str, space_id: uuid.UUID | str | None = None) -> EmbeddingModel:
    """The registered model ``model_id`` a space may be re-indexed with, else 400.

    Registered models are local models, served only with ``KNOWLEDGE_MODEL_RUNTIME=local``:
    under ``dify`` a space's model is its Dify embedding profile, so any ``embedding_model_id``
    is 400 ``capability_unavailable`` (the rule ``PUT …/embedding-profile`` applies to a local
    selection). Under ``local`` an id that is not registered is 400 ``unknown_embedding_model``.
    """
    if not isinstance(model_id, str) or not model_id:
        raise InvalidInput(
            "embedding_model_id must be a non-empty string", code="unknown_embedding_model"
        )
    if runtime_name() != "local":
        route = (
            f"PUT /v1/knowledge-spaces/{space_id}/embedding-profile"
            if space_id is not None
            else "PUT /v1/knowledge-spaces/{id}/embedding-profile"
        )
        raise InvalidInput(
            f"embedding_model_id: this server runs KNOWLEDGE_MODEL_RUNTIME={runtime_name()!r}, "
            "where a space's embedding model is its embedding profile (a model of a Dify "
            f"plugin, chosen with {route}); embedding_model_id names registered local models, "
            "which are served only with KNOWLEDGE_MODEL_RUNTIME=local",
            code="capability_unavailable",
            details={"field": "embedding_model_id"},
        )
    try:
        return get_embedding_model(model_id)
    except UnknownEmbeddingModel as exc:
        raise InvalidInput(
            str(exc),
            code="unknown_embedding_model",
            details={"registered": sorted(registered_model_ids())},
        ) from None


def live_versions(space_id: uuid.UUID) -> tuple[IndexVersion | None, IndexVersion | None]:
    """``(active, building)`` versions of the space (either may be ``None``)."""
    versions = {v.state: v for v in IndexVersion.objects.filter(space_id=space_id, state__in=_LIVE)}
    return versions.get(IndexState.ACTIVE), versions.get(IndexState.BUILDING)


def _next_number(space_id: uuid.UUID) -> int:
    top = IndexVersion.objects.filter(space_id=space_id).aggregate(top=Max("number"))["top"]
    return (top or 0) + 1


def ensure_active_version(
    space: KnowledgeSpace, *, default_model: EmbeddingModel | None = None
) -> IndexVersion:
    """The space's active version; the first call creates version 1.

    Version 1 uses ``default_model`` when given, else the space's embedding profile
    (:func:`spaces.profiles.index_model_for`: the registered id of a local model, or the vector
    space id of a model served through Dify, with the dimension its validation observed; a
    profile that is not ``ready`` raises ``spaces.profiles.SpaceNotReady``). The space's
    ``embedding_model_id``/``embedding_dimension`` are set to match.
    """
    active = IndexVersion.objects.filter(space_id=space.id, state=IndexState.ACTIVE).first()
    if active is not None:
        return active
    with transaction.atomic():
        locked = lock_for_update(KnowledgeSpace.objects.filter(id=space.id)).first()
        if locked is None:
            raise KnowledgeSpace.DoesNotExist(f"knowledge space {space.id} is gone")
        active = IndexVersion.objects.filter(space_id=space.id, state=IndexState.ACTIVE).first()
        if active is not None:
            return active
        if default_model is not None:
            model_id, dimension = default_model.model_id, default_model.dimension
        else:
            from spaces.profiles import index_model_for

            model_id, dimension = index_model_for(locked)
        now = timezone.now()
        active = IndexVersion.objects.create(
            space_id=space.id,
            number=_next_number(space.id),
            model_id=model_id,
            dimension=dimension,
            state=IndexState.ACTIVE,
            activated_at=now,
        )
        schedule_dense_index(model_id, dimension)
        KnowledgeSpace.objects.filter(id=space.id).update(
            embedding_model_id=model_id, embedding_dimension=dimension
        )
    return active


def schedule_dense_index(model_id: str, dimension: int) -> None:
    """Have the search backend prepare its index of ``(model_id, dimension)`` once the current
    transaction commits (at once outside one).

    A no-op on SQLite (exact search); on PostgreSQL the HNSW index of that model and dimension
    (:func:`retrieval.backends.pgvector.ensure_hnsw_index`, built ``CONCURRENTLY`` after the
    commit, so writers are not blocked; a pair that has its index costs one catalog lookup).
    Run-time DDL because models are configured per tenant and space: their pairs are not known
    when migrations run. Called for an *active* version created directly (a space's first);
    a *building* version's index is made by its rebuild task on the worker. A failure is logged;
    queries stay correct without the index (an exact scan).
    """

    def prepare() -> None:
        get_search_backend().prepare_dense_index(model_id, dimension)

    transaction.on_commit(prepare, robust=True)


def _check_dimension(version: IndexVersion, matrix: np.ndarray) -> None:
    if matrix.shape[1] != version.dimension:
        raise ValueError(
            f"index v{version.number} of space {version.space_id} holds {version.dimension}-d "
            f"vectors of {version.model_id!r}; refusing {matrix.shape[1]}-d vectors"
        )


# --- changing the model -----------------------------------------------------------------------


def model_change_needed(space: KnowledgeSpace, model_id: str) -> bool:
    """Whether :func:`change_embedding_model` with ``model_id`` would change anything."""
    active, building = live_versions(space.id)
    if active is None:
        return True
    if building is not None:
        return building.model_id != model_id
    return active.model_id != model_id


def change_embedding_model(space: KnowledgeSpace, model_id: str) -> IndexVersion:
    """Start indexing ``space`` with ``model_id``; returns the version that will serve it.

    - The model is already active: nothing to build (a building version for another model is
      retired); returns the active version.
    - A version for this model is already building: returns it.
    - Otherwise a new building version is created (replacing a building one for another model)
      and its rebuild is enqueued when the transaction commits. Queries keep using the active
      version until :func:`retrieval.index_builds.cutover`.
    - A space with no index yet (no document admitted) gets this model as active version 1.

    Raises 400 ``unknown_embedding_model`` for an id that is not registered and 400
    ``capability_unavailable`` unless the runtime is ``local`` (:func:`resolve_model`).
    """
    model = resolve_model(model_id, space.id)
    now = timezone.now()
    with transaction.atomic():
        if not lock_for_update(KnowledgeSpace.objects.filter(id=space.id)).exists():
            raise KnowledgeSpace.DoesNotExist(f"knowledge space {space.id} is gone")
        versions = {
            v.state: v
            for v in IndexVersion.objects.select_for_update().filter(
                space_id=space.id, state__in=_LIVE
            )
        }
        active = versions.get(IndexState.ACTIVE)
        building = versions.get(IndexState.BUILDING)
        if active is None:
            from spaces.profiles import adopt_registered_model

            # The embedding profile follows: the local profile of this model.
            adopt_registered_model(space, model.model_id, model.dimension)
            version = IndexVersion.objects.create(
                space_id=space.id,
                number=_next_number(space.id),
                model_id=model.model_id,
                dimension=model.dimension,
                state=IndexState.ACTIVE,
                activated_at=now,
            )
            schedule_dense_index(model.model_id, model.dimension)
            KnowledgeSpace.objects.filter(id=space.id).update(
                embedding_model_id=model.model_id,
                embedding_dimension=model.dimension,
                updated_at=now,
            )
            space.embedding_model_id, space.embedding_dimension = model.model_id, model.dimension
            return version
        if building is not None and building.model_id == model.model_id:
            return building
        if building is not None:
            _retire(building, now)
        if active.model_id == model.model_id:
            return active
        version = IndexVersion.objects.create(
            space_id=space.id,
            number=_next_number(space.id),
            model_id=model.model_id,
            dimension=model.dimension,
            state=IndexState.BUILDING,
            progress_at=now,
        )
        # Its HNSW index (PostgreSQL) is built by the rebuild task on the worker, before it
        # fills the version: no DDL in this request.
        transaction.on_commit(lambda: enqueue_rebuild(version.id), robust=True)
    logger.info(
        "space %s: building index v%s with %s beside v%s (%s)",
        space.id,
        version.number,
        model.model_id,
        active.number,
        active.model_id,
    )
    return version


def _retire(version: IndexVersion, now) -> None:
    IndexVersion.objects.filter(id=version.id, state=version.state).update(
        state=IndexState.RETIRED, retired_at=now
    )
    transaction.on_commit(lambda: purge_retired_vectors(version.space_id), robust=True)


def enqueue_rebuild(version_id: uuid.UUID) -> str | None:
    """Put the rebuild of a building version on the django-q2 queue; returns the task id."""
    from django_q.tasks import async_task

    if not IndexVersion.objects.filter(id=version_id, state=IndexState.BUILDING).exists():
        return None
    return async_task(
        "retrieval.tasks.rebuild_index",
        str(version_id),
        task_name=f"index-{version_id}",
        group="index",
    )


# --- cleanup and recovery ---------------------------------------------------------------------


def purge_retired_vectors(space_id: uuid.UUID | None = None) -> int:
    """Delete the vectors of retired versions (in batches, each its own commit); returns rows."""
    retired = IndexVersion.objects.filter(state=IndexState.RETIRED, vectors_purged_at__isnull=True)
    if space_id is not None:
        retired = retired.filter(space_id=space_id)
    deleted = 0
    # A backend keeping vectors outside the database (the Dify bridge) deletes them first.
    backend = get_search_backend() if backend_name() != "database" else None
    for version in retired:
        rows = DenseVector.objects.filter(space_id=version.space_id, index_version=version.number)
        while True:
            batch = list(rows.values_list("id", "node_id", "dimension")[:PURGE_BATCH])
            if not batch:
                break
            if backend is not None:
                backend.delete_version_vectors(
                    version.space_id, version.number, [(r[1], r[2]) for r in batch]
                )
            deleted += DenseVector.objects.filter(id__in=[r[0] for r in batch]).delete()[0]
        IndexVersion.objects.filter(id=version.id).update(vectors_purged_at=timezone.now())
    return deleted


def recover_index_builds(*, stalled_after: timedelta | None = None) -> int:
    """Re-enqueue building versions without progress for a while; returns how many.

    A version counts as stalled when its last committed batch (or enqueue) is older than
    ``stalled_after`` (default :data:`STALL_SECONDS`). Each is claimed by a compare-and-set on its
    progress time, so two sweeps never enqueue it twice. Vectors retired versions left behind (a
    purge interrupted by a crash) are deleted too.
    """
    stalled_after = stalled_after or timedelta(seconds=STALL_SECONDS)
    now = timezone.now()
    cutoff = now - stalled_after
    count = 0
    stalled = IndexVersion.objects.filter(state=IndexState.BUILDING).filter(
        Q(progress_at__lt=cutoff) | Q(progress_at__isnull=True)
    )
    for version_id, progress_at in stalled.values_list("id", "progress_at"):
        if IndexVersion.objects.filter(
            id=version_id, state=IndexState.BUILDING, progress_at=progress_at
        ).update(progress_at=now):
            try:
                enqueue_rebuild(version_id)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                logger.exception("could not enqueue the rebuild of index version %s", version_id)
                continue
            count += 1
    purge_retired_vectors()
    return count
