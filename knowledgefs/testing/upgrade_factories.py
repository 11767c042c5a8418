"""Upgrade jobs for tests, built directly in the state the staged run leaves them in.

Documents are real: admitted through :func:`ingestion.documents.admit_document` into a
real space (and compiled when a test queries them). :func:`succeeded_job` commits the job as the
run does on success: ``succeeded`` together with the first reconciliation lease, in one
transaction; publishing is the caller's business (a test may skip it: "interrupted before
publish").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ingestion.documents import admit_document
from ingestion.models import Document
from knowledgefs.errors import Conflict
from spaces.models import KnowledgeSpace
from upgrades.models import DocumentStatus, JobStage, JobStatus, UpgradeDocument, UpgradeJob


@dataclass
class Legacy:
    """One legacy document of the snapshot: its text, whether it should be served, metadata."""

    name: str
    text: str
    desired_enabled: bool = True
    metadata: dict[str, Any] | list[Any] | str | None = None
    handed_off: bool = True  # False: the hand-off failed (no new document)


def admit(space: KnowledgeSpace, legacy: Legacy, enqueue: bool = False) -> Document:
    """Admit the legacy bytes; the same bytes already in the space link to that document, as
    the run's hand-off does (``duplicate_document`` → the existing document)."""
    try:
        return admit_document(
            space, filename=legacy.name, data=legacy.text.encode(), enqueue=enqueue
        ).document
    except Conflict as exc:
        if exc.code != "duplicate_document":
            raise
        return Document.objects.get(id=exc.details["existing_document_id"])


def succeeded_job(
    space: KnowledgeSpace,
    legacy: list[Legacy],
    *,
    lease: bool = True,
    now: datetime | None = None,
    status: str = JobStatus.SUCCEEDED,
    enqueue: bool = False,
) -> tuple[UpgradeJob, uuid.UUID | None]:
    """A job whose documents were handed off into ``space``; returns ``(job, first token)``.

    With ``lease`` the job carries the first lease (token, expiry now + lease TTL, dispatched
    now, one attempt) written in the same transaction as the success, as the run writes it.
    ``status`` other than succeeded makes a job the run has not finished (no lease then).
    ``enqueue`` queues the documents' compilation after the commit (for a running cluster).
    """
    now = now or timezone.now()
    token = uuid.uuid4() if lease and status == JobStatus.SUCCEEDED else None
    with transaction.atomic():
        job = UpgradeJob.objects.create(
            tenant_id=space.tenant_id,
            dataset_id=f"dataset-{uuid.uuid4().hex[:8]}",
            idempotency_key=uuid.uuid4().hex,
            requested_by="account-1",
            owner="account-1",
            snapshot_at=now,
            status=status,
            stage=JobStage.COMPLETED if status == JobStatus.SUCCEEDED else JobStage.VALIDATING,
            space=space,
            total_documents=len(legacy),
            completed_documents=sum(1 for item in legacy if item.handed_off),
            failed_documents=sum(1 for item in legacy if not item.handed_off),
            completed_at=now if status == JobStatus.SUCCEEDED else None,
            reconcile_lease_token=token,
            reconcile_lease_expires_at=(
                now + timedelta(seconds=settings.KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS)
                if token
                else None
            ),
            reconcile_dispatched_at=now if token else None,
            reconcile_attempt_count=1 if token else 0,
        )
        for n, item in enumerate(legacy):
            UpgradeDocument.objects.create(
                job=job,
                tenant_id=space.tenant_id,
                legacy_document_id=f"legacy-{n}",
                name=item.name,
                data_source_type="upload_file",
                desired_enabled=item.desired_enabled,
                legacy_archived=False,
                metadata_snapshot=item.metadata if item.metadata is not None else {},
                status=DocumentStatus.SUCCEEDED if item.handed_off else DocumentStatus.FAILED,
                document=admit(space, item, enqueue) if item.handed_off else None,
            )
    return job, token


class SteppingClock:
    """A controllable clock for the reconciliation time seam: returns ``now``; ``hooks`` maps a
    call number (1-based) to a function run at that call, whose return value becomes ``now``."""

    def __init__(self, start: datetime, step: timedelta = timedelta(0)) -> None:
        self.now = start
        self.step = step
        self.calls = 0
        self.hooks: dict[int, Callable[..., Any]] = {}

    def __call__(self) -> datetime:
        self.calls += 1
        hook = self.hooks.get(self.calls)
        if hook is not None:
            self.now = hook()
        value = self.now
        self.now = self.now + self.step
        return value
