"""Index versions: which dense indexes a compilation writes into, model changes and cutover.

Every dense vector belongs to an :class:`~retrieval.models.IndexVersion` of its space: one
embedding model, one dimension. A space has one ``active`` version (queries use it) and, after
its embedding model is changed, one ``building`` version filled beside it:

- The compiler asks :func:`projection_targets` for the versions that must receive new nodes
  (the active one first, then the building one), embeds the nodes once per target and hands
  everything to :func:`index_projections` inside the transaction that also writes its
  checkpoint. That call re-reads the versions under their row locks, so whatever the compiler
  embedded for a version that was retired meanwhile is dropped, and a version that became active
  meanwhile without being embedded for is embedded on the spot: in-flight work either finishes
  on the old version (and is carried over by the cutover) or lands on the new one.
- :func:`change_embedding_model` creates the building version and enqueues
  :func:`rebuild_index_version` (``retrieval.tasks.rebuild_index``), which embeds every published
  node lacking a vector in that version in bounded batches, each committed on its own (a crash
  loses at most one batch; a second run finds nothing left to do), then calls :func:`cutover`.
- :func:`cutover` holds the space's row lock, checks that every node the active version serves
  (published nodes, and nodes a running job already projected) has a vector in the building
  version, embeds any that are missing and tries again, then flips by compare-and-set:
  ``building`` → ``active``, old ``active`` → ``retired``, the space's ``embedding_model_id`` and
  ``embedding_dimension`` follow, and the publication head moves so every cached dense matrix is
  rebuilt. The retired version's vectors are deleted after that commit.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import timedelta

import numpy as np
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, Max, OuterRef, Q
from django.utils import timezone

from ingestion.models import KnowledgeNode
from ingestion.projection import ProjectionTarget
from knowledgefs.db import lock_for_update
from knowledgefs.errors import InvalidInput
from knowledgefs.runtime import (
    EmbeddingModel,
    UnknownEmbeddingModel,
    get_embedding_model,
    registered_model_ids,
    runtime_name,
)
from retrieval.backends import IndexedNode, backend_name, get_search_backend
from retrieval.models import DenseVector, IndexState, IndexVersion, IndexVersionQuerySet
from spaces.models import KnowledgeSpace, PublicationHead

logger = logging.getLogger("knowledgefs.indexing")

REBUILD_BATCH = 64  # nodes embedded and committed together by a rebuild
CUTOVER_ATTEMPTS = 5  # the last attempt embeds stragglers under the lock instead of retrying
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


def index_summary(versions) -> dict:
    """``{"active": {number, model_id, dimension} | None, "building": … | None}``."""
    return IndexVersionQuerySet.summary(versions)  # any iterable of versions


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


# --- the compiler's seam ----------------------------------------------------------------------


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
                matrix = vectors.get(version.number)
                if matrix is not None:
                    matrix = matrix[rows] if len(rows) != len(nodes) else matrix
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


def _check_dimension(version: IndexVersion, matrix: np.ndarray) -> None:
    if matrix.shape[1] != version.dimension:
        raise ValueError(
            f"index v{version.number} of space {version.space_id} holds {version.dimension}-d "
            f"vectors of {version.model_id!r}; refusing {matrix.shape[1]}-d vectors"
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
      version until :func:`cutover`.
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


# --- building ---------------------------------------------------------------------------------


def _missing(version: IndexVersion, served_by: IndexVersion | None = None):
    """Nodes of the version's space without a vector in it, in a stable order.

    Without ``served_by``: the published nodes (generation = the document's active one). With
    it: also every node that has a vector in ``served_by`` (a running job's projected nodes).
    """
    has_vector = Exists(
        DenseVector.objects.filter(node_id=OuterRef("id"), index_version=version.number)
    )
    wanted = Q(generation=F("document__active_generation"))
    if served_by is not None:
        wanted |= Exists(
            DenseVector.objects.filter(node_id=OuterRef("id"), index_version=served_by.number)
        )
    return (
        KnowledgeNode.objects.filter(space_id=version.space_id)
        .filter(wanted)
        .filter(~has_vector)
        .order_by("id")
    )


def _write_vectors(
    version: IndexVersion, rows: list[tuple[uuid.UUID, uuid.UUID, str]], matrix: np.ndarray
) -> bool:
    """Store one embedded batch while the version is still building; ``False`` if it is not.

    Nodes deleted since they were read are skipped; a node that already has a vector in the
    version (another run got there first) keeps it.
    """
    _check_dimension(version, matrix)
    with transaction.atomic():
        if (
            not IndexVersion.objects.select_for_update()
            .filter(id=version.id, state=IndexState.BUILDING)
            .exists()
        ):
            return False
        alive = set(
            KnowledgeNode.objects.filter(id__in=[r[0] for r in rows]).values_list("id", flat=True)
        )
        keep = [i for i, r in enumerate(rows) if r[0] in alive]
        get_search_backend().index_dense(
            [IndexedNode(rows[i][0], version.space_id, rows[i][1], rows[i][2]) for i in keep],
            matrix[keep],
            index_version=version.number,
            model_id=version.model_id,
            ignore_conflicts=True,
        )
        IndexVersion.objects.filter(id=version.id).update(progress_at=timezone.now(), last_error="")
    return True


def _fill(version: IndexVersion, queryset, batch_size: int) -> bool:
    """Embed and store every node of ``queryset`` in batches; ``False`` if the build ended."""
    model = get_embedding_model(version.model_id, space=version.space_id)
    conflicts = 0
    while True:
        rows = list(queryset.values_list("id", "document_id", "text")[:batch_size])
        if not rows:
            return True
        matrix = np.asarray(model.embed_documents([r[2] for r in rows]), dtype=np.float32)
        try:
            if not _write_vectors(version, rows, matrix):
                return False
        except IntegrityError:
            # A node was deleted between the read and the commit (a document replaced or
            # removed meanwhile): read the batch again.
            conflicts += 1
            if conflicts > 5:
                raise
            logger.info("index v%s: a node went away while embedding; retrying", version.number)


def rebuild_index_version(version_id: uuid.UUID | str, *, batch_size: int = REBUILD_BATCH) -> str:
    """Fill a building version, then cut over to it; returns the version's resulting state.

    Embeds, ``batch_size`` nodes at a time and each batch in its own transaction, every
    published node of the space that has no vector in this version. Safe to run twice, or
    concurrently (a second run skips what the first wrote), and after a crash it resumes where
    the committed batches end. A version that is no longer building is left alone.
    """
    version = IndexVersion.objects.filter(id=uuid.UUID(str(version_id))).first()
    if version is None:
        return "missing"
    if version.state != IndexState.BUILDING:
        return version.state
    try:
        get_search_backend().prepare_dense_index(version.model_id, version.dimension)
        if not _fill(version, _missing(version), batch_size):
            return _state(version.id)
        return cutover(version.id, batch_size=batch_size)
    except Exception as exc:
        IndexVersion.objects.filter(id=version.id, state=IndexState.BUILDING).update(
            last_error=f"{type(exc).__name__}: {exc}"[:4000]
        )
        raise


def _state(version_id: uuid.UUID) -> str:
    state = IndexVersion.objects.filter(id=version_id).values_list("state", flat=True).first()
    return state or "missing"


def cutover(
    version_id: uuid.UUID | str,
    *,
    attempts: int = CUTOVER_ATTEMPTS,
    batch_size: int = REBUILD_BATCH,
) -> str:
    """Make a complete building version the active one; returns the version's resulting state.

    Under the space's row lock (``SELECT … FOR UPDATE``, then the live versions' rows) every node
    the active version serves must have a vector in the building version. Missing ones (a
    document published, or projected by a running job, since the rebuild read its batches) are
    embedded after the lock is released and the check runs again; the last attempt embeds them
    under the lock so the cutover always ends. Then one compare-and-set flips the states, the
    space's model fields follow and the publication head moves; after that commit the retired
    version's vectors are deleted.
    """
    version_id = uuid.UUID(str(version_id))
    for attempt in range(1, attempts + 1):
        with transaction.atomic():
            space_id = (
                IndexVersion.objects.filter(id=version_id).values_list("space_id", flat=True)
            ).first()
            if space_id is None:
                return "missing"
            if not lock_for_update(KnowledgeSpace.objects.filter(id=space_id)).exists():
                return "missing"
            versions = {
                v.state: v
                for v in IndexVersion.objects.select_for_update().filter(
                    space_id=space_id, state__in=_LIVE
                )
            }
            version = versions.get(IndexState.BUILDING)
            if version is None or version.id != version_id:
                return _state(version_id)
            old = versions.get(IndexState.ACTIVE)
            missing = _missing(version, served_by=old)
            if missing.exists():
                if attempt < attempts:
                    pending = True
                else:
                    logger.warning("index v%s: embedding stragglers under lock", version.number)
                    _fill(version, missing, batch_size)
                    pending = False
            else:
                pending = False
            if not pending:
                now = timezone.now()
                if old is not None:
                    IndexVersion.objects.filter(id=old.id, state=IndexState.ACTIVE).update(
                        state=IndexState.RETIRED, retired_at=now
                    )
                if not IndexVersion.objects.filter(id=version.id, state=IndexState.BUILDING).update(
                    state=IndexState.ACTIVE, activated_at=now, progress_at=now, last_error=""
                ):
                    raise RuntimeError(f"index v{version.number} changed state during cutover")
                KnowledgeSpace.objects.filter(id=space_id).update(
                    embedding_model_id=version.model_id,
                    embedding_dimension=version.dimension,
                    updated_at=now,
                )
                from spaces.profiles import follow_cutover

                follow_cutover(space_id, version.model_id, version.dimension)
                PublicationHead.objects.advance(space_id)
        if not pending:
            logger.info(
                "space %s: index v%s (%s) is active%s",
                space_id,
                version.number,
                version.model_id,
                f"; v{old.number} retired" if old is not None else "",
            )
            purge_retired_vectors(space_id)
            return IndexState.ACTIVE
        if not _fill(version, _missing(version, served_by=old), batch_size):
            return _state(version_id)
    return _state(version_id)  # pragma: no cover - the last attempt always flips


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
