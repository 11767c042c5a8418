"""Building an index version and the cutover to it.

- :func:`rebuild_index_version` (``retrieval.tasks.rebuild_index``) embeds every published node
  lacking a vector in a building version in bounded batches, each committed on its own (a crash
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

import numpy as np
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.expressions import Combinable
from django.utils import timezone

from ingestion.models import KnowledgeNode
from knowledgefs.db import lock_for_update
from knowledgefs.runtime import get_embedding_model
from retrieval.backends import IndexedNode, get_search_backend
from retrieval.index_versions import _LIVE, _check_dimension, purge_retired_vectors
from retrieval.models import DenseVector, IndexState, IndexVersion
from spaces.models import KnowledgeSpace, PublicationHead

logger = logging.getLogger("knowledgefs.indexing")

REBUILD_BATCH = 64  # nodes embedded and committed together by a rebuild
CUTOVER_ATTEMPTS = 5  # the last attempt embeds stragglers under the lock instead of retrying


# --- building ---------------------------------------------------------------------------------


def _missing(version: IndexVersion, served_by: IndexVersion | None = None):
    """Nodes of the version's space without a vector in it, in a stable order.

    Without ``served_by``: the published nodes (generation = the document's active one). With
    it: also every node that has a vector in ``served_by`` (a running job's projected nodes).
    """
    has_vector = Exists(
        DenseVector.objects.filter(node_id=OuterRef("id"), index_version=version.number)
    )
    # Q | Exists is a Q at run time; the stubs type it through Exists.__ror__ (Combinable)
    wanted: Q | Combinable = Q(generation=F("document__active_generation"))
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
            _follow_visual(space_id)
            return IndexState.ACTIVE
        if not _fill(version, _missing(version, served_by=old), batch_size):
            return _state(version_id)
    return _state(version_id)  # pragma: no cover - the last attempt always flips


def _follow_visual(space_id) -> None:
    """After a cutover the visual projections follow the profile now active: rebuilt with an
    image-capable model, removed for a text-only one (:func:`ingestion.visual.backfill_space`).
    A failure leaves the old vectors unreachable (queries never mix profiles) and is logged with
    the runbook's command."""
    from ingestion.visual import backfill_space

    try:
        backfill_space(space_id)
    except Exception:  # noqa: BLE001 - the cutover stands; the backfill can be run again
        logger.warning(
            "space %s: visual projections not rebuilt after the cutover; run "
            "`kfs visual backfill --space <slug> --tenant <tenant>`",
            space_id,
            exc_info=True,
        )
