"""Publishing: make jobs' generations their documents' visible ones, all in one transaction.

Lock order: the document rows (in id order), then their jobs; the space's publication head then
moves by one compare-and-set, so a query sees all of the new generations or none.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone

from ingestion import revisions
from ingestion.compilation.errors import LeaseLost
from ingestion.compilation.generations import _drop_other_generations
from ingestion.compilation.leases import _checkpoint_many, _per_row
from ingestion.compilation.progress import _progress
from ingestion.models import CompilationJob, Document, DocumentState, RunState, Stage
from knowledgefs.db import lock_for_update
from spaces.models import PublicationHead


def publish(job: CompilationJob, token: uuid.UUID, *, node_count: int) -> None:
    """Publish one job (see :func:`publish_many`); raises :class:`LeaseLost` if it is not ours."""
    if not publish_many([(job, token, node_count)]):
        raise LeaseLost(str(job.id))


def publish_many(items: list[tuple[CompilationJob, uuid.UUID, int]]) -> list[uuid.UUID]:
    """Make each job's generation its document's visible one, all in one transaction.

    For every job still held with its token: the job succeeds, the document's
    ``active_generation`` points at it and the previous generation's nodes and projections are
    removed. The space's publication head then moves forward by one compare-and-set, so a query
    sees all of these documents' new generations or none of them. Every other generation of the
    document (the previous one, leftovers of superseded attempts) is removed in the same commit.
    Jobs whose lease was lost, or whose document was deleted, are skipped. Returns the ids of
    the jobs published. The statements do not grow with the number of jobs: the documents are
    locked by one SELECT, the jobs checkpointed by one locked read and one UPDATE, the
    documents updated by one UPDATE (``CASE`` per row) and the other generations removed by one
    SELECT and one DELETE per table.
    """
    if not items:
        return []
    now = timezone.now()
    counts = {job.id: node_count for job, _, node_count in items}
    with transaction.atomic():
        # Lock order everywhere: the document rows first (here in id order, so two publishers
        # cannot deadlock on each other), then their jobs. A deleted document is skipped.
        present = dict(
            lock_for_update(
                Document.objects.filter(id__in={job.document_id for job, _, _ in items}).order_by(
                    "id"
                )
            ).values_list("id", "storage_key")
        )
        items = [item for item in items if item[0].document_id in present]
        # One locked read and one UPDATE for every job still held with its token.
        done = _checkpoint_many(
            {job.id: token for job, token, _ in items},
            stage=Stage.PUBLISHED,
            run_state=RunState.SUCCEEDED,
            lease_token=None,
            lease_expires_at=None,
            finished_at=now,
            heartbeat_at=now,
            error_code="",
            error_message="",
            per_job={
                "progress": {
                    j: _progress("published", "published", 100, nodes_total=n, nodes_embedded=n)
                    for j, n in counts.items()
                }
            },
        )
        published = [job for job, _, _ in items if job.id in done]
        if published:
            # (every published job's document is in ``present``: none is None)
            keep = {job.document_id: job.id for job in published if job.document_id is not None}
            # Each published revision becomes its document's active one, in the same UPDATE
            # (ingestion.revisions); replaced source objects are deleted after the commit.
            swapped, orphaned = revisions.swap_published(published, present)
            columns = {
                name: _per_row(Document, name, {d: f[name] for d, f in swapped.items()})
                for name, _ in revisions.SWAPPED_FIELDS
                if swapped
            }
            Document.objects.filter(id__in=keep).update(
                **columns,
                active_generation=_per_row(Document, "active_generation", keep),
                node_count=_per_row(
                    Document, "node_count", {d: counts[j] for d, j in keep.items()}
                ),
                state=DocumentState.PUBLISHED,
                error_code="",
                error_message="",
                updated_at=now,
            )
            revisions.delete_sources_after_commit(orphaned)
            # The previous published generation and anything a superseded or abandoned attempt
            # left behind go in the same commit.
            _drop_other_generations(keep)
            for space_id in {job.space_id for job in published}:
                PublicationHead.objects.advance(space_id)
    return [job.id for job in published]
