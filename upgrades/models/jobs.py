"""Upgrade jobs, their documents and the file leases (tables ``upgrade_job``, ``upgrade_document``,
``upgrade_file_lease``).

Two independent claims live on a job row:

* the **step claim** (``task_id``): the staged run. A dispatch writes a fresh ``task_id`` while the
  job is ``queued`` and unclaimed, and only then enqueues; a delivery starts only by a
  compare-and-set ``queued`` → ``running`` with that same ``task_id``, and every checkpoint or
  failure write is conditioned on ``running`` with it (fencing).
* the **reconciliation lease** (``reconcile_lease_token`` + ``reconcile_lease_expires_at``): once a
  job has succeeded, the deliveries that apply each document's availability and metadata. A token
  becomes current only by replacing an absent or expired lease (or by its holder's rotation); a
  delivery writes only while its token is current and unexpired.

Uniqueness "one active upgrade per Dataset": a partial unique index on (``tenant_id``,
``dataset_id``) where ``status`` is queued or running on PostgreSQL and SQLite; MySQL/MariaDB have
no partial indexes, so there the stored generated column ``active_dataset_id`` (the dataset id
while queued or running, else NULL) carries a unique index, added by a MySQL-only migration
operation. NULLs never collide, so finished jobs for one Dataset are allowed everywhere.

Changing ``status`` or ``dataset_id`` later: ``active_dataset_id`` is computed from both, and
PostgreSQL refuses ``ALTER COLUMN … TYPE`` on a column a generated column uses. A migration that
alters either field must remove ``active_dataset_id`` first (on MySQL/MariaDB after dropping its
unique index ``upgrade_job_active_dataset_gen_uq``), alter the field, then add both back, all in
one migration; ``tests/system/test_migrations_engines.py`` fails otherwise. On MySQL/MariaDB text
comparison follows the ``_ci`` collation, so the uniqueness is case-insensitive there (Dify ids
are lowercase UUIDs; see docs/upgrades.md, "Engine differences").
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Case, F, Q, Value, When

from spaces.models import KnowledgeSpace


class JobStatus(models.TextChoices):
    """The job's run state (see docs/operations.md for the transitions)."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


ACTIVE_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)


class JobStage(models.TextChoices):
    """The last committed stage; each delivery runs exactly one bounded step of it."""

    VALIDATING = "validating", "Validating"
    WAITING_FOR_SPACE = "waiting_for_space", "Waiting for space"
    CREATING_SOURCES = "creating_sources", "Creating sources"
    SUBMITTING_DOCUMENTS = "submitting_documents", "Submitting documents"
    MIGRATING_ACCESS = "migrating_access", "Migrating access"
    FINALIZING = "finalizing", "Finalizing"
    COMPLETED = "completed", "Completed"


class DocumentStatus(models.TextChoices):
    """An upgrade document's hand-off state; ``processing`` is re-pickable after a crash."""

    PENDING = "pending", "Pending"
    PROCESSING = "processing", "Processing"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class FileLeaseStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"


class UpgradeJob(models.Model):
    """The upgrade of one classic Dify Dataset into a new knowledge space.

    The snapshot fields (``*_snapshot``, ``snapshot_at``, ``requested_by``, ``owner``) are written
    once at submission and never change. ``space`` is the knowledge space the run creates.
    Counters are non-negative (check constraints). ``last_error_message`` is at most 4,000
    characters.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    dataset_id = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255)
    requested_by = models.CharField(max_length=64)
    owner = models.CharField(max_length=64)
    snapshot_at = models.DateTimeField()
    config_snapshot = models.JSONField(default=dict)
    permission_snapshot = models.JSONField(default=dict)
    app_binding_snapshot = models.JSONField(default=list)
    tag_ids_snapshot = models.JSONField(default=list)

    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    stage = models.CharField(max_length=32, choices=JobStage.choices, default=JobStage.VALIDATING)
    space = models.ForeignKey(
        KnowledgeSpace,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="upgrade_jobs",
    )
    resolved_configuration = models.JSONField(null=True, blank=True)
    total_documents = models.IntegerField(default=0)
    completed_documents = models.IntegerField(default=0)
    failed_documents = models.IntegerField(default=0)
    attempt_count = models.IntegerField(default=0)

    # Step claim (fencing token of the staged run).
    task_id = models.CharField(max_length=64, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    next_step_at = models.DateTimeField(null=True, blank=True)
    not_ready_since = models.DateTimeField(null=True, blank=True)

    last_error_code = models.CharField(max_length=128, null=True, blank=True)
    last_error_message = models.TextField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    # Reconciliation delivery lease.
    reconcile_lease_token = models.UUIDField(null=True, blank=True)
    reconcile_lease_expires_at = models.DateTimeField(null=True, blank=True)
    reconcile_dispatched_at = models.DateTimeField(null=True, blank=True)
    reconcile_attempt_count = models.IntegerField(default=0)
    reconcile_completed_at = models.DateTimeField(null=True, blank=True)
    reconcile_dead_lettered_at = models.DateTimeField(null=True, blank=True)

    active_dataset_id = models.GeneratedField(
        expression=Case(
            When(status__in=[JobStatus.QUEUED, JobStatus.RUNNING], then=F("dataset_id")),
            default=Value(None),
            output_field=models.CharField(max_length=64, null=True),
        ),
        output_field=models.CharField(max_length=64, null=True),
        db_persist=True,
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "upgrade_job"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "idempotency_key"], name="upgrade_job_idempotency_uq"
            ),
            models.UniqueConstraint(
                fields=["tenant_id", "dataset_id"],
                condition=Q(status__in=["queued", "running"]),
                name="upgrade_job_active_dataset_uq",
            ),
            models.CheckConstraint(
                condition=Q(total_documents__gte=0)
                & Q(completed_documents__gte=0)
                & Q(failed_documents__gte=0)
                & Q(attempt_count__gte=0)
                & Q(reconcile_attempt_count__gte=0),
                name="upgrade_job_counters_ck",
            ),
            models.CheckConstraint(
                condition=Q(
                    reconcile_lease_token__isnull=True, reconcile_lease_expires_at__isnull=True
                )
                | Q(reconcile_lease_token__isnull=False, reconcile_lease_expires_at__isnull=False),
                name="upgrade_job_reconcile_lease_ck",
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant_id", "dataset_id", "created_at"], name="upgrade_job_dataset_idx"
            ),
            # The tenant's upgrade list, newest first with the id breaking ties (keyset pages).
            models.Index(fields=["tenant_id", "-created_at", "-id"], name="upgrade_job_tenant_idx"),
            models.Index(fields=["status", "updated_at"], name="upgrade_job_status_idx"),
            models.Index(
                fields=["status", "reconcile_completed_at", "reconcile_lease_expires_at"],
                name="upgrade_job_reconcile_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"upgrade {self.id} of dataset {self.dataset_id} ({self.status}/{self.stage})"


class UpgradeDocument(models.Model):
    """One legacy Dataset document in an upgrade: its snapshot, hand-off and reconciliation
    checkpoint.

    ``desired_enabled`` is the legacy "enabled and not archived"; ``metadata_snapshot`` the legacy
    metadata values. ``document`` is the new document once handed off. The checkpoint is
    ``state_reconciled_at`` (NULL = still owed); attempts are counted and capped, after which the
    document is dead-lettered (``state_dead_lettered_at``). ``state_reconcile_error`` holds the
    last failed attempt (``<code>: <message>``) while owed, and on a reconciled row the note of
    how it was reconciled without its own write (``document_deleted: …``,
    ``document_merged: …``), else NULL.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(UpgradeJob, on_delete=models.CASCADE, related_name="documents")
    tenant_id = models.CharField(max_length=64)
    legacy_document_id = models.CharField(max_length=64)
    name = models.CharField(max_length=255)
    data_source_type = models.CharField(max_length=32)
    upload_file_id = models.CharField(max_length=64, null=True, blank=True)
    source_key = models.CharField(max_length=1024, null=True, blank=True)
    desired_enabled = models.BooleanField(default=True)
    legacy_archived = models.BooleanField(default=False)
    legacy_indexing_status = models.CharField(max_length=32, blank=True, default="")
    metadata_snapshot = models.JSONField(default=dict)

    status = models.CharField(
        max_length=16, choices=DocumentStatus.choices, default=DocumentStatus.PENDING
    )
    document = models.ForeignKey(
        "ingestion.Document",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="upgrade_sources",
    )
    compilation_job_id = models.UUIDField(null=True, blank=True)
    last_error_code = models.CharField(max_length=128, null=True, blank=True)
    last_error_message = models.TextField(null=True, blank=True)

    state_reconcile_attempt_count = models.IntegerField(default=0)
    state_reconciled_at = models.DateTimeField(null=True, blank=True)
    state_reconcile_error = models.TextField(null=True, blank=True)
    state_dead_lettered_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "upgrade_document"
        constraints = [
            models.UniqueConstraint(
                fields=["job", "legacy_document_id"], name="upgrade_document_identity_uq"
            ),
            models.CheckConstraint(
                condition=Q(state_reconcile_attempt_count__gte=0),
                name="upgrade_document_attempts_ck",
            ),
        ]
        indexes = [
            models.Index(fields=["job", "status", "id"], name="upgrade_document_dispatch_idx"),
            models.Index(
                fields=["job", "state_reconciled_at", "id"], name="upgrade_document_reconcile_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class UpgradeFileLease(models.Model):
    """Keeps one legacy uploaded file's bytes alive while an upgrade still needs them.

    TTL 7 days from the snapshot, moved to now + 7 days on every delivery and retry (reference
    upgrade-file-lease behaviour); released when the last document of the job that references the
    file has been handed off.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(UpgradeJob, on_delete=models.CASCADE, related_name="file_leases")
    upload_file_id = models.CharField(max_length=64)
    source_key = models.CharField(max_length=1024, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=FileLeaseStatus.choices, default=FileLeaseStatus.ACTIVE
    )
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    cleanup_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "upgrade_file_lease"
        constraints = [
            models.UniqueConstraint(fields=["job", "upload_file_id"], name="upgrade_file_lease_uq"),
        ]
        indexes = [
            models.Index(
                fields=["upload_file_id", "status", "expires_at"],
                name="upgrade_file_lease_file_idx",
            )
        ]

    def __str__(self) -> str:
        return f"lease on {self.upload_file_id} ({self.status})"
