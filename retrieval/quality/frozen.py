"""The frozen publication of a replay run: which documents a replay may read (docs/quality.md,
"What a replay freezes").

A document keeps only its live node generation (publishing a replacement deletes the old one),
so a replay cannot read an older publication back. What it can do exactly is leave out what was
published **after** the snapshot and notice when what it froze is gone:

* at creation (:func:`freeze_publication`) the run records the publication head's revision, the
  freeze time ``frozen_at`` and ``documents``: how many documents of the space had a published
  generation then;
* for each item (:class:`FrozenPublication`, resolved again whenever the head moves) the
  retrieval is restricted to the documents whose live revision was published at or before
  ``frozen_at`` (documents compiled before revisions existed carry no publication time and
  count as frozen). A document first published after the snapshot is left out
  (``excluded_documents``);
* when fewer documents published at or before ``frozen_at`` remain than the snapshot held, a
  frozen generation was deleted (its document deleted, or replaced by a newer revision): the run
  fails ``frozen_snapshot_unavailable`` naming how many, rather than replay a publication that no
  longer exists.

Availability is not frozen: a document disabled after the snapshot is not read (retrieval never
returns a disabled document), and one enabled after it is read when its revision is older than
the snapshot.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from retrieval.filters import Allowed


class SnapshotGone(Exception):
    """The run's frozen snapshot (index version or publication) is no longer there."""


def _published(space_id):
    from ingestion.models import Document

    return Document.objects.filter(space_id=space_id, active_generation__isnull=False)


def freeze_publication(space, head_revision: int) -> dict:
    """``{revision, frozen_at, documents}`` of ``space``'s publication now."""
    return {
        "revision": head_revision,
        "frozen_at": timezone.now().isoformat(),
        "documents": _published(space.id).count(),
    }


def _frozen_at(publication: dict) -> datetime | None:
    raw = publication.get("frozen_at")
    return parse_datetime(raw) if isinstance(raw, str) else None


class FrozenPublication:
    """The documents one delivery of a run may read; one query per publication-head revision
    seen (a run on an unchanged space resolves once)."""

    def __init__(self, run):
        self.space = run.space
        snapshot = run.frozen_snapshot or {}
        self.publication = snapshot.get("publication") or {}
        self.frozen_at = _frozen_at(self.publication)
        self._revision: int | None = None
        self._allowed: Allowed | None = None
        self.excluded = 0

    def allowed(self, head: int) -> Allowed | None:
        """The frozen documents as a retrieval restriction at publication-head revision
        ``head``, or ``None`` for a run frozen before publications were recorded (it reads the
        live publication). Raises :class:`SnapshotGone` when a frozen generation was deleted."""
        if self.frozen_at is None:
            return None
        if head != self._revision or self._allowed is None:
            self._allowed = self._resolve()
            self._revision = head
        return self._allowed

    def _resolve(self) -> Allowed:
        import time

        started = time.perf_counter()
        published = _published(self.space.id)
        frozen_filter = Q(active_revision__isnull=True) | Q(
            active_revision__published_at__lte=self.frozen_at
        )
        rows = list(published.filter(frozen_filter).values_list("id", "enabled"))
        kept = len(rows)
        expected = int(self.publication.get("documents") or 0)
        if kept < expected:
            raise SnapshotGone(
                f"{expected - kept} of the {expected} documents published at the frozen "
                f"publication (revision {self.publication.get('revision')}) were deleted or "
                "replaced since, so their frozen generation is gone; retry the run to replay "
                "on a fresh snapshot"
            )
        self.excluded = published.exclude(frozen_filter).count()
        ids = frozenset(i for i, enabled in rows if enabled)
        return Allowed(ids, len(ids), (time.perf_counter() - started) * 1000)
