"""Sources, their items and their runs (docs/datasources.md).

A :class:`Source` names a Dify datasource connection by ``credential_id`` only (Dify holds every
secret), the provider ``<org>/<plugin>/<provider>``, the plugin's datasource name and its
parameters. A :class:`SourceItem` is one provider item imported into the space: one logical
document keyed by ``(source, provider item id)`` with what change detection compares (etag,
last-edited time, content SHA-256). A :class:`SourceRun` is one durable import or sync, claimed
and leased through the jobs kernel (:mod:`ingestion.sources.dispatch`), with one
:class:`SourceRunItem` per item as its checkpoint: a later delivery runs only pending items.

The models reference ``ingestion.Document`` by name, so this module imports no other ingestion
module (``ingestion.models`` imports it).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from knowledgefs.db import SpaceScopedQuerySet
from knowledgefs.jobs.run_states import LIVE_RUN_STATES as LIVE_RUN_STATES
from knowledgefs.jobs.run_states import RunState as RunState
from spaces.models import KnowledgeSpace


class SourceKind(models.TextChoices):
    WEBSITE = "website", "Website crawl"
    ONLINE_DOCUMENT = "online_document", "Online document"
    ONLINE_DRIVE = "online_drive", "Online drive"


#: Dify's ``datasource_type`` of each kind.
DATASOURCE_TYPE = {
    SourceKind.WEBSITE: "website_crawl",
    SourceKind.ONLINE_DOCUMENT: "online_document",
    SourceKind.ONLINE_DRIVE: "online_drive",
}


class SyncMode(models.TextChoices):
    MANUAL = "manual", "Manual"
    INTERVAL = "interval", "Interval (daily)"
    CUSTOM = "custom", "Custom interval"


class Source(models.Model):
    """One datasource of a space. ``revision`` guards the sync policy (compare-and-set);
    ``next_run_at`` is when the schedule starts its next sync (``None``: never)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="sources")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, choices=SourceKind.choices)
    provider = models.CharField(max_length=256)
    datasource = models.CharField(max_length=256)
    credential_id = models.CharField(max_length=512)
    parameters = models.JSONField(default=dict, blank=True)
    sync_mode = models.CharField(max_length=16, choices=SyncMode.choices, default=SyncMode.MANUAL)
    sync_enabled = models.BooleanField(default=False)
    sync_interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    sync_revision = models.PositiveIntegerField(default=1)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = SpaceScopedQuerySet.as_manager()

    class Meta:
        db_table = "ingestion_source"
        indexes = [
            models.Index(fields=["space", "-created_at"], name="source_space_created"),
            models.Index(fields=["sync_enabled", "next_run_at"], name="source_due"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def datasource_type(self) -> str:
        return DATASOURCE_TYPE[SourceKind(self.kind)]


class ItemState(models.TextChoices):
    ACTIVE = "active", "Active"
    DISABLED = "disabled", "Disabled (gone at the provider)"


class SourceItem(models.Model):
    """One provider item imported from a source: its logical document and what the last
    successful read saw (``etag``, ``last_edited``, ``sha256`` of the bytes compiled).
    ``item_digest`` is the SHA-256 of ``provider_item_id`` (unique per source)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="items")
    provider_item_id = models.TextField()
    item_digest = models.CharField(max_length=64)
    name = models.CharField(max_length=512)
    detail = models.JSONField(default=dict, blank=True)
    document = models.ForeignKey(
        "ingestion.Document", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    etag = models.CharField(max_length=1024, blank=True, default="")
    last_edited = models.CharField(max_length=64, blank=True, default="")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=ItemState.choices, default=ItemState.ACTIVE)
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "ingestion_source_item"
        constraints = [
            models.UniqueConstraint(fields=["source", "item_digest"], name="source_item_unique")
        ]
        indexes = [models.Index(fields=["state", "disabled_at"], name="source_item_disabled")]

    def __str__(self) -> str:
        return self.name


class RunKind(models.TextChoices):
    ONLINE_DOCUMENT_IMPORT = "online-document-import", "Online-document import"
    ONLINE_DRIVE_IMPORT = "online-drive-import", "Online-drive import"
    SYNC = "sync", "Sync"
    CRAWL_PREVIEW = "crawl-preview", "Crawl preview (pages listed, no content kept)"
    CRAWL_IMPORT = "crawl-import", "Crawl import (a preview's frozen selection)"
    BULK = "bulk", "Bulk action over sources"


class Checkpoint(models.TextChoices):
    QUEUED = "queued", "Queued"
    PROVIDER_READ = "provider-read", "Provider read (items staged)"
    MATERIALIZED = "materialized", "Items materialized"
    SOURCE_COMMITTED = "source-committed", "Source committed"


class SourceRun(models.Model):
    """One durable import or sync of a source. The delivery claim is the jobs kernel's
    (``task_id``, ``claimed_at``, ``step_started_at``, ``attempt_count``); ``checkpoint``
    says how far it got, its items what each item came to."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    #: ``None`` for a ``bulk`` run, whose items name the sources it acts on.
    source = models.ForeignKey(
        Source, null=True, blank=True, on_delete=models.CASCADE, related_name="runs"
    )
    kind = models.CharField(max_length=32, choices=RunKind.choices)
    trigger = models.CharField(max_length=16, default="api")  # api | schedule | bulk
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    checkpoint = models.CharField(
        max_length=32, choices=Checkpoint.choices, default=Checkpoint.QUEUED
    )
    progress_total = models.PositiveIntegerField(null=True, blank=True)
    progress_completed = models.PositiveIntegerField(default=0)
    progress_skipped = models.PositiveIntegerField(default=0)
    progress_failed = models.PositiveIntegerField(default=0)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    task_id = models.CharField(max_length=64, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    retry_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    objects = SpaceScopedQuerySet.as_manager()

    class Meta:
        db_table = "ingestion_source_run"
        indexes = [
            models.Index(fields=["space", "-created_at"], name="source_run_space_created"),
            models.Index(fields=["state", "updated_at"], name="source_run_state_updated"),
            models.Index(fields=["source", "state"], name="source_run_source_state"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} run {self.id} ({self.state})"


class RunItemState(models.TextChoices):
    PENDING = "pending", "Pending"
    IMPORTED = "imported", "Imported (new document)"
    UPDATED = "updated", "Updated (candidate revision)"
    UNCHANGED = "unchanged", "Unchanged (skipped)"
    DISABLED = "disabled", "Gone at the provider (document disabled)"
    FAILED = "failed", "Failed"
    LISTED = "listed", "Listed by a crawl preview (no content kept)"
    DONE = "done", "Done (a bulk action applied to the source)"


class SourceRunItem(models.Model):
    """One item of a run, its checkpoint: ``pending`` until done, then never run again.
    ``payload`` is what the run needs to read it (ids, names, the provider's etag or
    last-edited time or checksum; a crawled page's content until it is done)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(SourceRun, on_delete=models.CASCADE, related_name="items")
    ordinal = models.PositiveIntegerField()
    provider_item_id = models.TextField()
    item_digest = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=RunItemState.choices, default=RunItemState.PENDING
    )
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    document_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "ingestion_source_run_item"
        constraints = [
            models.UniqueConstraint(fields=["run", "item_digest"], name="source_run_item_unique"),
        ]
        indexes = [models.Index(fields=["run", "state", "ordinal"], name="source_run_item_todo")]
