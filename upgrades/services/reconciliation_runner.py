"""Document reconciliation after a successful upgrade, the durable runner: availability and
metadata of every handed-off document, delivered under a job-level lease and recovered by a
schedule (which documents are owed: :mod:`upgrades.services.reconciliation_ledger`; the
retrieval gate: :mod:`upgrades.services.reconciliation_gate`).

Lifecycle of a job's reconciliation lease (columns ``reconcile_*`` on :class:`UpgradeJob`):

* ``none``: the job has not succeeded. The run commits ``succeeded`` together with the first
  lease (token T1, expiry now + ``KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS``) and publishes
  ``upgrades.reconciliation_tasks.reconcile_documents(job_id, T1)`` after the commit.
* ``leased(T)``: a delivery is out. It is accepted only while T is the job's current token and the
  expiry is in the future (I9). Every write it makes is conditioned on (job, T, that expiry, still
  unexpired): zero rows means the lease is lost and the delivery stops without another write
  (I10). After one bounded batch it rotates T → T' (new expiry) and publishes a continuation with
  T'; when the batch made no progress it releases the lease instead, so the next recovery tick
  (about a minute later) retries. A document whose attempt failed is not tried again for
  ``KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS``: the back-off of documents that keep
  failing, so the attempt cap measures time and not the speed of continuations.
* ``owed``: succeeded, not done, no live lease (never published, publish failed, message lost,
  worker died, lease released or expired). :func:`recover_reconciliations`, run every minute by
  the django-q2 schedule ``knowledgefs.recover_reconciliations``, issues a fresh token by a
  compare-and-set conditioned on the lease it saw, so two ticks never both re-issue.
* ``done``: no document checkpoint remains; ``reconcile_completed_at`` is set and the token
  cleared in the same compare-and-set. Every later delivery is rejected without a write.
* ``dead-lettered``: nothing is owed but some documents exhausted
  ``KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS``; ``reconcile_dead_lettered_at`` is set, recovery
  leaves the job alone and the space stays gated until an operator re-arms it
  (:func:`upgrades.services.reconciliation_ledger.rearm_dead_lettered`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from ingestion.availability import (
    patch_document_metadata,
    set_document_availability,
    validate_metadata_patch,
)
from ingestion.models import Document
from knowledgefs.errors import NotFound, ServiceError
from knowledgefs.jobs import schedules
from upgrades.models import DocumentStatus, JobStatus, UpgradeDocument, UpgradeJob
from upgrades.services.reconciliation_ledger import (
    dead_lettered_documents,
    due_documents,
    owed_documents,
)

logger = logging.getLogger("knowledgefs.upgrades.reconciliation")

TASK_FUNCTION = "upgrades.reconciliation_tasks.reconcile_documents"
RECOVERY_FUNCTION = "upgrades.reconciliation_tasks.recover_reconciliations"
RECOVERY_SCHEDULE = "knowledgefs.recover_reconciliations"
RECOVERY = schedules.Schedule(RECOVERY_SCHEDULE, RECOVERY_FUNCTION)
"""The recovery tick every minute (the unit of django-q2 schedules; within the 30–60 s the
upgrade spec asks for), registered by ``UpgradesConfig.ready()``; migration ``upgrades.0005``
creates the same row."""
MAX_ERROR_CHARS = 4000  # as the job's last_error_message

Clock = Callable[[], datetime]


class _LeaseLost(Exception):
    """Raised inside a checkpoint transaction when the lease compare-and-set matched no row."""


class _DocumentNotReady(Exception):
    """The upgrade document names no new document (yet), or one outside the job's space."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Lease:
    """One delivery's hold on a job: its token and the expiry it was issued with."""

    job_id: uuid.UUID
    token: uuid.UUID
    expires_at: datetime

    def holds(self, now: datetime) -> Q:
        """The compare-and-set condition of every write of this delivery (I9/I10)."""
        return Q(
            id=self.job_id,
            reconcile_lease_token=self.token,
            reconcile_lease_expires_at=self.expires_at,
            reconcile_lease_expires_at__gt=now,
            reconcile_completed_at__isnull=True,
        )


@dataclass
class DeliveryOutcome:
    """What one delivery did. ``status`` is ``rejected`` (not the current live token, or done:
    nothing written), ``lease_lost`` (the lease moved on mid-batch; it stopped), ``continued``
    (rotated to ``next_token`` and published), ``released`` (no progress: left for recovery),
    ``completed`` or ``dead_lettered``."""

    status: str
    reconciled: int = 0
    failed: int = 0
    remaining: int = 0
    next_token: uuid.UUID | None = None
    stopped_early: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reconciled": self.reconciled,
            "failed": self.failed,
            "remaining": self.remaining,
            "next_token": str(self.next_token) if self.next_token else None,
            "stopped_early": self.stopped_early,
        }


@dataclass
class RecoveryReport:
    """Jobs a recovery tick looked at (``candidates``) and re-issued (``issued`` job ids)."""

    candidates: int = 0
    issued: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "issued": self.issued}


def _lease_seconds() -> int:
    return settings.KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS


def hard_timeout_seconds() -> int:
    """The django-q2 timeout of a delivery: halfway between its time budget and the lease TTL,
    so even a delivery that ignores its budget is killed before its lease can be re-issued."""
    budget = settings.KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS
    return (budget + _lease_seconds()) // 2


# --- lease issue and publish --------------------------------------------------------------------
def issue_lease(
    job_id: uuid.UUID,
    *,
    seen_token: uuid.UUID | None,
    seen_expires_at: datetime | None,
    now: datetime | None = None,
) -> uuid.UUID | None:
    """Make a fresh token current for a succeeded, unfinished, not dead-lettered job; returns it,
    or ``None`` when the lease is no longer the one seen (someone else issued or rotated it, it
    is live, or the job finished).

    One compare-and-set conditioned on the lease the caller saw: absent (``seen_token`` None) or
    exactly ``(seen_token, seen_expires_at)`` and expired by ``now``. Expiry: now +
    ``KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS``; ``reconcile_attempt_count`` counts issues.
    """
    now = now or timezone.now()
    condition = Q(
        id=job_id,
        status=JobStatus.SUCCEEDED,
        reconcile_completed_at__isnull=True,
        reconcile_dead_lettered_at__isnull=True,
    )
    if seen_token is None:
        condition &= Q(reconcile_lease_token__isnull=True)
    else:
        condition &= Q(
            reconcile_lease_token=seen_token,
            reconcile_lease_expires_at=seen_expires_at,
            reconcile_lease_expires_at__lte=now,
        )
    token = uuid.uuid4()
    issued = UpgradeJob.objects.filter(condition).update(
        reconcile_lease_token=token,
        reconcile_lease_expires_at=now + timedelta(seconds=_lease_seconds()),
        reconcile_dispatched_at=now,
        reconcile_attempt_count=F("reconcile_attempt_count") + 1,
        updated_at=now,
    )
    return token if issued else None


def publish(job_id: uuid.UUID, token: uuid.UUID) -> bool:
    """Put one delivery ``(job id, token)`` on the queue; ``False`` (logged) when the broker
    refused it: the lease then simply expires and recovery re-issues (nothing to undo)."""
    from django_q.tasks import async_task

    from upgrades.services import dispatch

    options: dict[str, Any] = {}
    broker = dispatch._broker()  # the staged run's broker seam (KNOWLEDGE_UPGRADE_BROKER_CLASS)
    if broker is not None:
        options["broker"] = broker
    try:
        async_task(
            TASK_FUNCTION,
            str(job_id),
            str(token),
            task_name=f"reconcile:{token}",
            group="upgrade-reconcile",
            timeout=hard_timeout_seconds(),
            **options,
        )
    except Exception:  # noqa: BLE001 - a broker failure is healed by expiry plus recovery
        logger.exception("could not publish reconciliation of job %s; recovery re-issues", job_id)
        return False
    return True


def publish_on_commit(job_id: uuid.UUID, token: uuid.UUID) -> None:
    """:func:`publish` once the surrounding transaction commits (at once outside of one)."""
    transaction.on_commit(lambda: publish(job_id, token))


# --- one delivery -------------------------------------------------------------------------------
def run_delivery(
    job_id: uuid.UUID | str, lease_token: uuid.UUID | str, *, clock: Clock = timezone.now
) -> DeliveryOutcome:
    """Handle one delivery of ``(job_id, lease_token)``: at most
    ``KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE`` due documents (owed, and not within the retry
    delay of a failed attempt: :func:`due_documents`), in id order, within
    ``KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS``; then rotate and publish a
    continuation, release, complete or dead-letter (see the module docstring).

    A delivery whose token is not the job's current one, whose lease expired, or whose job is
    done, dead-lettered or not succeeded is rejected before any write or document lookup.
    ``clock`` is the time seam (tests pass a controllable one); it is read before every write.
    """
    lease = _accept(job_id, lease_token, clock())
    if lease is None:
        return DeliveryOutcome("rejected")
    started = clock()
    deadline = started + timedelta(
        seconds=settings.KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS
    )
    batch = list(
        due_documents(lease.job_id, started).order_by("id")[
            : settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE
        ]
    )
    groups = _groups(lease.job_id, batch)
    # Only this batch's documents are looked up (never the whole space).
    documents = Document.objects.in_bulk([g.document_id for g in groups if g.document_id])
    space_id = UpgradeJob.objects.filter(id=lease.job_id).values_list("space_id", flat=True)[0]
    outcome = DeliveryOutcome("continued")
    for group in groups:
        if clock() >= deadline:
            outcome.stopped_early = True
            break
        try:
            if _checkpoint(lease, group, documents.get(group.document_id), space_id, clock):
                outcome.reconciled += len(group.owed)
            else:
                outcome.failed += len(group.owed)
        except _LeaseLost:
            outcome.status = "lease_lost"
            return outcome
    return _finish(lease, outcome, clock)


def _accept(job_id: uuid.UUID | str, lease_token: uuid.UUID | str, now: datetime) -> Lease | None:
    try:
        job_uuid = uuid.UUID(str(job_id))
        token = uuid.UUID(str(lease_token))
    except ValueError:
        return None
    row = (
        UpgradeJob.objects.filter(
            id=job_uuid,
            status=JobStatus.SUCCEEDED,
            reconcile_lease_token=token,
            reconcile_lease_expires_at__gt=now,
            reconcile_completed_at__isnull=True,
            reconcile_dead_lettered_at__isnull=True,
        )
        .values_list("reconcile_lease_expires_at", flat=True)
        .first()
    )
    return Lease(job_uuid, token, row) if row is not None else None


def _fence(lease: Lease, now: datetime) -> None:
    """The lease compare-and-set at the start of a checkpoint transaction; on PostgreSQL it also
    locks the job row, so a recovery tick cannot re-issue until the checkpoint commits."""
    if not UpgradeJob.objects.filter(lease.holds(now)).update(updated_at=now):
        raise _LeaseLost


@dataclass
class _Group:
    """The hand-offs of one job that share one new document, in legacy-document order (the
    snapshot's order: ``UpgradeDocument.id``). ``members`` are all of them (their desired states
    are merged); ``owed`` those this checkpoint marks reconciled. A hand-off whose document link
    is NULL forms a group of its own."""

    document_id: uuid.UUID | None
    members: list[UpgradeDocument]
    owed: list[UpgradeDocument]


def _groups(job_id: uuid.UUID, batch: list[UpgradeDocument]) -> list[_Group]:
    """The batch as groups by new document: two legacy documents with the same bytes are
    deduplicated onto one document at hand-off, so every succeeded hand-off of the job linking
    it (also outside the batch, and already reconciled ones) takes part in its merged state,
    and all of them that are owed are checkpointed together. One query."""
    linked = {item.document_id for item in batch if item.document_id}
    siblings: dict[uuid.UUID, list[UpgradeDocument]] = {}
    rows = UpgradeDocument.objects.filter(
        job_id=job_id, status=DocumentStatus.SUCCEEDED, document_id__in=linked
    ).order_by("id")
    for row in rows:
        assert row.document_id is not None  # filtered on document_id__in
        siblings.setdefault(row.document_id, []).append(row)
    groups: list[_Group] = []
    seen: set[uuid.UUID] = set()
    for item in batch:
        if item.document_id is None:
            groups.append(_Group(None, [item], [item]))
            continue
        if item.document_id in seen:
            continue
        seen.add(item.document_id)
        members = siblings.get(item.document_id) or [item]
        owed = [
            m for m in members if m.state_reconciled_at is None and m.state_dead_lettered_at is None
        ]
        groups.append(_Group(item.document_id, members, owed or [item]))
    return groups


def _checkpoint(
    lease: Lease, group: _Group, document: Document | None, space_id: uuid.UUID | None, clock: Clock
) -> bool:
    """Apply one document's merged state under the lease and checkpoint every owed hand-off of
    it together; ``True`` when reconciled, ``False`` when the attempt failed and was recorded on
    each of them. Raises :class:`_LeaseLost` with nothing written."""
    ids = [m.id for m in group.owed]
    with transaction.atomic():
        now = clock()
        _fence(lease, now)
        try:
            with transaction.atomic():
                note = _apply(group, document, space_id)
                UpgradeDocument.objects.filter(id__in=ids, state_reconciled_at__isnull=True).update(
                    state_reconciled_at=now,
                    state_reconcile_error=note[:MAX_ERROR_CHARS] if note else None,
                    updated_at=now,
                )
            return True
        except Exception as exc:  # noqa: BLE001 - every failure counts one attempt
            for item in group.owed:
                _record_attempt(item, exc, now)
            return False


def _deleted_note(group: _Group) -> str:
    which = f"document {group.document_id}" if group.document_id else "document"
    return (
        f"document_deleted: the new {which} was deleted before its availability and metadata "
        "were applied; nothing of it can be served, so nothing is owed"
    )


def _apply(group: _Group, document: Document | None, space_id: uuid.UUID | None) -> str | None:
    """Metadata first, then availability when it differs, chaining the row versions; returns the
    note recorded with the checkpoint (``None``, or why it was reconciled without a write).

    A hand-off is ``succeeded`` only together with its document link, so a missing document
    (the link set NULL, or the row gone) was deleted by the tenant: it is reconciled with a
    ``document_deleted`` note instead of failing for ever. Raises ``_DocumentNotReady``
    (``document_outside_space``) and the write errors of :mod:`ingestion.availability`.
    """
    if document is None:
        return _deleted_note(group)
    if document.space_id != space_id:
        raise _DocumentNotReady(
            "document_outside_space", "the linked document is not in the upgrade's space"
        )
    enabled, patch, note = _merged_state(group)
    version = document.row_version
    try:
        if patch:
            version = patch_document_metadata(document.id, patch, version)
        if document.enabled != enabled:
            set_document_availability(document.id, enabled, version)
    except NotFound as exc:
        if exc.code != "document_not_found":
            raise
        return _deleted_note(group)
    return note


def _merged_state(group: _Group) -> tuple[bool, dict[str, Any], str | None]:
    """``(enabled, metadata patch, note)`` of a group. One hand-off: its own desired state.
    Several (legacy documents deduplicated onto one document): enabled when ANY of them is
    desired enabled (the shared content is served if one legacy document served it); metadata is
    the merge of their snapshots in legacy-document order where the first legacy document
    holding a key wins, and every overridden value is named in the note. Raises 400
    ``invalid_metadata`` for a snapshot that is not an object."""
    if len(group.members) == 1:
        only = group.members[0]
        return (
            only.desired_enabled,
            validate_metadata_patch(_metadata_patch(only.metadata_snapshot)),
            None,
        )
    enabled = any(m.desired_enabled for m in group.members)
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    conflicts: list[str] = []
    for member in group.members:
        patch = validate_metadata_patch(_metadata_patch(member.metadata_snapshot))
        for key, value in patch.items():
            if key not in merged:
                merged[key], source[key] = value, member.legacy_document_id
            elif merged[key] != value:
                conflicts.append(
                    f"{key!r}: kept {merged[key]!r} of {source[key]}, "
                    f"dropped {value!r} of {member.legacy_document_id}"
                )
    legacy = ", ".join(m.legacy_document_id for m in group.members)
    note = (
        f"document_merged: legacy documents {legacy} share document {group.document_id}; "
        f"enabled={str(enabled).lower()} (any of them enabled); metadata merged in legacy order, "
        "the first value wins"
    )
    if conflicts:
        note += "; conflicts: " + "; ".join(conflicts)
    return enabled, merged, note


def _metadata_patch(snapshot: object) -> object:
    """The snapshot as a ``{name: value}`` patch; a list of ``{"name", "value"}`` entries (the
    legacy field-list shape) is accepted too. Anything else is passed on and refused by
    :func:`ingestion.availability.validate_metadata_patch`."""
    if isinstance(snapshot, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in snapshot
    ):
        return {e["name"]: e.get("value") for e in snapshot}
    return snapshot or {}


def _record_attempt(item: UpgradeDocument, exc: Exception, now: datetime) -> None:
    attempts = item.state_reconcile_attempt_count + 1
    if isinstance(exc, ServiceError | _DocumentNotReady):
        message = f"{exc.code}: {exc}"
    else:
        message = f"{type(exc).__name__}: {exc}"
    values: dict[str, Any] = {
        "state_reconcile_attempt_count": attempts,
        "state_reconcile_error": message[:MAX_ERROR_CHARS],
        "updated_at": now,
    }
    if attempts >= settings.KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS:
        values["state_dead_lettered_at"] = now
        logger.warning(
            "upgrade document %s dead-lettered after %d attempts: %s", item.id, attempts, message
        )
    UpgradeDocument.objects.filter(id=item.id, state_reconciled_at__isnull=True).update(**values)


def _finish(lease: Lease, outcome: DeliveryOutcome, clock: Clock) -> DeliveryOutcome:
    """After the batch: rotate and continue, release, complete or dead-letter: one
    compare-and-set on the lease each; zero rows is ``lease_lost``."""
    now = clock()
    outcome.remaining = owed_documents(lease.job_id).count()
    holding = UpgradeJob.objects.filter(lease.holds(now))
    if outcome.remaining and outcome.reconciled:
        token = uuid.uuid4()
        with transaction.atomic():
            if holding.update(
                reconcile_lease_token=token,
                reconcile_lease_expires_at=now + timedelta(seconds=_lease_seconds()),
                reconcile_dispatched_at=now,
                reconcile_attempt_count=F("reconcile_attempt_count") + 1,
                updated_at=now,
            ):
                outcome.next_token = token
                publish_on_commit(lease.job_id, token)
                return outcome
    elif outcome.remaining:
        released = holding.update(
            reconcile_lease_token=None, reconcile_lease_expires_at=None, updated_at=now
        )
        if released:
            outcome.status = "released"
            return outcome
    elif dead_lettered_documents(lease.job_id).exists():
        if holding.update(
            reconcile_dead_lettered_at=now,
            reconcile_lease_token=None,
            reconcile_lease_expires_at=None,
            updated_at=now,
        ):
            outcome.status = "dead_lettered"
            return outcome
    elif holding.update(
        reconcile_completed_at=now,
        reconcile_lease_token=None,
        reconcile_lease_expires_at=None,
        updated_at=now,
    ):
        outcome.status = "completed"
        return outcome
    outcome.status = "lease_lost"
    return outcome


# --- recovery -----------------------------------------------------------------------------------
def recoverable_jobs(now: datetime) -> QuerySet[UpgradeJob]:
    """Succeeded jobs, not done, not dead-lettered, with no live lease (none, or expired).

    Owed checkpoints are not required: a succeeded job with nothing owed whose completing
    delivery was lost still needs one delivery to mark it done (else its space stays gated).
    """
    return UpgradeJob.objects.filter(
        Q(reconcile_lease_token__isnull=True) | Q(reconcile_lease_expires_at__lte=now),
        status=JobStatus.SUCCEEDED,
        reconcile_completed_at__isnull=True,
        reconcile_dead_lettered_at__isnull=True,
    )


def recover_reconciliations(
    *, now: datetime | None = None, batch: int | None = None
) -> RecoveryReport:
    """The recovery tick: for up to ``batch`` (``KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH``)
    recoverable jobs, issue a fresh lease by compare-and-set on the lease seen and publish it
    after the commit.

    Rows are locked ``FOR UPDATE SKIP LOCKED`` where the database has it (PostgreSQL, MySQL 8),
    so a concurrent tick skips them; the compare-and-set alone already makes a second issue for
    the same lease impossible (SQLite, whose writers are serialised). Jobs with a live lease,
    done, dead-lettered or not succeeded are never touched.
    """
    now = now or timezone.now()
    batch = batch or settings.KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH
    report = RecoveryReport()
    queryset = recoverable_jobs(now).only(
        "id", "reconcile_lease_token", "reconcile_lease_expires_at"
    )
    with transaction.atomic():
        if connection.features.has_select_for_update_skip_locked:
            queryset = queryset.select_for_update(skip_locked=True)
        else:
            queryset = queryset.select_for_update()
        for job in queryset.order_by("updated_at", "id")[:batch]:
            report.candidates += 1
            token = issue_lease(
                job.id,
                seen_token=job.reconcile_lease_token,
                seen_expires_at=job.reconcile_lease_expires_at,
                now=now,
            )
            if token is not None:
                report.issued.append(str(job.id))
                publish_on_commit(job.id, token)
    return report


def ensure_recovery_schedule() -> Any:  # a django_q Schedule row (untyped library)
    """Create or repair the recovery tick's django-q2 schedule (:data:`RECOVERY`); returns it."""
    return schedules.ensure(RECOVERY_SCHEDULE)
