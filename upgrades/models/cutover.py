"""The per-workspace cutover ledger and cleanup authorizations (tables
``upgrade_cutover_ledger`` and ``upgrade_cleanup_authorization``).

A workspace (Dify tenant) that moves from classic Datasets to knowledge spaces has one ledger
row. Its ``phase`` advances ``inventory → backfill → shadow → frozen → cutover → observing →
ready_for_cleanup``; every write is one compare-and-set UPDATE on (``tenant_id``, expected
``phase``, expected ``cas_version``) that increments ``cas_version`` and writes explicit values,
NULLs included (:mod:`upgrades.services.cutover`). A tenant without a ledger is a native
knowledge-space tenant and is never gated.

A cleanup authorization is the four-eyes permission to remove a workspace's legacy data:
``requested → approved → started → completed``, each a compare-and-set on ``row_version`` and
the expected status (:mod:`upgrades.services.cleanup`). Starting one sets the ledger's
``irreversible_cleanup_at``, after which the workspace can no longer be rolled back.

The rules below are check constraints, so they hold on SQLite, PostgreSQL and MySQL/MariaDB
whatever writes the rows.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import F, Q


class CutoverPhase(models.TextChoices):
    """A workspace's cutover phase, in forward order."""

    INVENTORY = "inventory", "Inventory"
    BACKFILL = "backfill", "Backfill"
    SHADOW = "shadow", "Shadow"
    FROZEN = "frozen", "Frozen"
    CUTOVER = "cutover", "Cutover"
    OBSERVING = "observing", "Observing"
    READY_FOR_CLEANUP = "ready_for_cleanup", "Ready for cleanup"


#: Phases in which product traffic may flow (the runtime gate checks the rest).
CUT_OVER_PHASES = (CutoverPhase.CUTOVER, CutoverPhase.OBSERVING, CutoverPhase.READY_FOR_CLEANUP)
#: Phases that follow a remote freeze: they must carry the freeze evidence.
FROZEN_OR_LATER = (CutoverPhase.FROZEN, *CUT_OVER_PHASES)

#: The four feature switches a cutover turns on together.
SWITCHES = (
    "product_routes_enabled",
    "capability_v2_enabled",
    "integrated_mode_enabled",
    "legacy_acl_read_only",
)

_FREEZE_FIELDS = ("remote_freeze_id", "remote_freeze_revision", "remote_freeze_acked_at")
_ACTIVATION_FIELDS = (
    "activation_id",
    "activation_revision",
    "activation_ledger_cas_version",
    "activation_acked_at",
)


def all_or_none(fields: tuple[str, ...]) -> Q:
    """``Q`` that holds when every field of the group is NULL or every one is set."""
    return Q(**{f"{name}__isnull": True for name in fields}) | Q(
        **{f"{name}__isnull": False for name in fields}
    )


class WorkspaceCutoverLedger(models.Model):
    """One workspace's cutover state.

    Time fences (UTC): ``freeze_at`` (remote freeze acknowledged), ``cutover_at`` (activation
    acknowledged; needs ``freeze_at``), ``rolled_back_at`` (set by a rollback, NULL again after a
    re-cutover), ``rollback_cutoff_at`` (no rollback from then on; needs ``cutover_at``),
    ``observation_started_at``/``observation_ends_at`` (the observation window),
    ``maximum_task_expires_at`` (when the last task issued before the cutover expires),
    ``irreversible_cleanup_at`` (a cleanup has started: no rollback any more).

    Evidence groups, each all-NULL or all-set: the remote freeze (``remote_freeze_*``) and the
    remote activation (``activation_*``). ``smoke_results`` and ``smoke_passed_at`` likewise.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=64, unique=True)
    phase = models.CharField(
        max_length=32, choices=CutoverPhase.choices, default=CutoverPhase.INVENTORY
    )
    cas_version = models.BigIntegerField(default=0)

    freeze_at = models.DateTimeField(null=True, blank=True)
    cutover_at = models.DateTimeField(null=True, blank=True)
    rolled_back_at = models.DateTimeField(null=True, blank=True)
    rollback_cutoff_at = models.DateTimeField(null=True, blank=True)
    observation_started_at = models.DateTimeField(null=True, blank=True)
    observation_ends_at = models.DateTimeField(null=True, blank=True)
    maximum_task_expires_at = models.DateTimeField(null=True, blank=True)
    irreversible_cleanup_at = models.DateTimeField(null=True, blank=True)

    product_routes_enabled = models.BooleanField(default=False)
    capability_v2_enabled = models.BooleanField(default=False)
    integrated_mode_enabled = models.BooleanField(default=False)
    legacy_acl_read_only = models.BooleanField(default=False)

    remote_freeze_id = models.CharField(max_length=128, null=True, blank=True)
    remote_freeze_revision = models.BigIntegerField(null=True, blank=True)
    remote_freeze_acked_at = models.DateTimeField(null=True, blank=True)

    activation_id = models.CharField(max_length=128, null=True, blank=True)
    activation_revision = models.BigIntegerField(null=True, blank=True)
    activation_ledger_cas_version = models.BigIntegerField(null=True, blank=True)
    activation_acked_at = models.DateTimeField(null=True, blank=True)

    smoke_results = models.JSONField(null=True, blank=True)
    smoke_passed_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "upgrade_cutover_ledger"
        constraints = [
            models.CheckConstraint(
                condition=Q(phase__in=CutoverPhase.values), name="upgrade_ledger_phase_ck"
            ),
            models.CheckConstraint(
                condition=Q(cas_version__gte=0), name="upgrade_ledger_cas_version_ck"
            ),
            models.CheckConstraint(
                condition=all_or_none(_FREEZE_FIELDS), name="upgrade_ledger_freeze_evidence_ck"
            ),
            models.CheckConstraint(
                condition=all_or_none(_ACTIVATION_FIELDS),
                name="upgrade_ledger_activation_evidence_ck",
            ),
            models.CheckConstraint(
                condition=all_or_none(("smoke_results", "smoke_passed_at")),
                name="upgrade_ledger_smoke_ck",
            ),
            models.CheckConstraint(
                condition=Q(cutover_at__isnull=True) | Q(freeze_at__isnull=False),
                name="upgrade_ledger_cutover_needs_freeze_ck",
            ),
            models.CheckConstraint(
                condition=Q(rollback_cutoff_at__isnull=True) | Q(cutover_at__isnull=False),
                name="upgrade_ledger_cutoff_needs_cutover_ck",
            ),
            models.CheckConstraint(
                condition=all_or_none(("observation_started_at", "observation_ends_at")),
                name="upgrade_ledger_observation_ck",
            ),
            models.CheckConstraint(
                condition=~Q(phase__in=list(FROZEN_OR_LATER))
                | Q(freeze_at__isnull=False, remote_freeze_id__isnull=False),
                name="upgrade_ledger_frozen_evidence_ck",
            ),
            models.CheckConstraint(
                condition=~Q(phase__in=list(CUT_OVER_PHASES))
                | Q(cutover_at__isnull=False, activation_id__isnull=False),
                name="upgrade_ledger_cutover_evidence_ck",
            ),
        ]

    def __str__(self) -> str:
        return f"cutover ledger of {self.tenant_id} ({self.phase}, v{self.cas_version})"


class CleanupStatus(models.TextChoices):
    """A cleanup authorization's state, in order."""

    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    STARTED = "started", "Started"
    COMPLETED = "completed", "Completed"


_APPROVED = ("approved_by", "approved_at", "approval_expires_at")
_STARTED = ("started_by", "started_at", "started_ledger_cas_version", "start_evidence")
_COMPLETED = (
    "completed_by",
    "completed_at",
    "completion_evidence",
    "completed_ledger_cas_version",
)


def _set(fields: tuple[str, ...]) -> Q:
    return Q(**{f"{name}__isnull": False for name in fields})


def _null(fields: tuple[str, ...]) -> Q:
    return Q(**{f"{name}__isnull": True for name in fields})


def cleanup_status_fields(with_completion: bool) -> Q:
    """Each status carries exactly its own field groups and every later group is NULL
    (``with_completion=False`` is the three-status rule of migration 0003)."""
    later = _COMPLETED if with_completion else ()
    rule = (
        Q(status="requested") & _null(_APPROVED + _STARTED + later)
        | Q(status="approved") & _set(_APPROVED) & _null(_STARTED + later)
        | Q(status="started") & _set(_APPROVED + _STARTED) & _null(later)
    )
    if with_completion:
        rule |= Q(status="completed") & _set(_APPROVED + _STARTED + _COMPLETED)
    return rule


def cleanup_ledger_versions(with_completion: bool) -> Q:
    """Versions are non-negative; a completion never records an older ledger version than
    its start."""
    rule = Q(row_version__gte=0) & (
        Q(started_ledger_cas_version__isnull=True) | Q(started_ledger_cas_version__gte=0)
    )
    if with_completion:
        rule &= Q(completed_ledger_cas_version__isnull=True) | Q(
            completed_ledger_cas_version__gte=F("started_ledger_cas_version")
        )
    return rule


class CleanupAuthorization(models.Model):
    """Four-eyes permission to remove one workspace's legacy data.

    ``requested_by`` asks, a different operator approves (``approved_by`` ≠ ``requested_by``,
    a check constraint) and the approval lapses at ``approval_expires_at``; a start needs an
    unexpired approval and records the ledger's ``cas_version`` (``started_ledger_cas_version``);
    completion records its evidence and the ledger version then. ``row_version`` increments on
    every transition. ``tenant_id`` always equals the ledger's (the service sets it from the
    ledger).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    ledger = models.ForeignKey(
        WorkspaceCutoverLedger, on_delete=models.PROTECT, related_name="cleanup_authorizations"
    )
    status = models.CharField(
        max_length=16, choices=CleanupStatus.choices, default=CleanupStatus.REQUESTED
    )
    row_version = models.BigIntegerField(default=0)
    reason = models.TextField(blank=True, default="")

    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField()
    approved_by = models.CharField(max_length=150, null=True, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    started_by = models.CharField(max_length=150, null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    started_ledger_cas_version = models.BigIntegerField(null=True, blank=True)
    start_evidence = models.JSONField(null=True, blank=True)
    completed_by = models.CharField(max_length=150, null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    completion_evidence = models.JSONField(null=True, blank=True)
    completed_ledger_cas_version = models.BigIntegerField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "upgrade_cleanup_authorization"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=CleanupStatus.values),
                name="upgrade_cleanup_status_ck",
            ),
            models.CheckConstraint(
                condition=cleanup_status_fields(with_completion=True),
                name="upgrade_cleanup_status_fields_ck",
            ),
            models.CheckConstraint(
                condition=cleanup_ledger_versions(with_completion=True),
                name="upgrade_cleanup_ledger_versions_ck",
            ),
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True) | ~Q(approved_by=F("requested_by")),
                name="upgrade_cleanup_four_eyes_ck",
            ),
            models.CheckConstraint(
                condition=Q(approval_expires_at__isnull=True)
                | Q(approval_expires_at__gt=F("approved_at")),
                name="upgrade_cleanup_approval_window_ck",
            ),
            models.CheckConstraint(
                condition=Q(completed_at__isnull=True) | Q(completed_at__gte=F("started_at")),
                name="upgrade_cleanup_completion_time_ck",
            ),
        ]
        indexes = [
            models.Index(fields=["ledger", "status"], name="upgrade_cleanup_ledger_idx"),
        ]

    def __str__(self) -> str:
        return f"cleanup of {self.tenant_id} ({self.status})"
