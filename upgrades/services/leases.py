"""File leases: keep a legacy uploaded file's bytes alive while an upgrade still needs them.

One lease per (job, ``upload_file_id``), created at the snapshot with a TTL of 7 days (bridge
specification §1.4), moved to now + 7 days on every delivery and every retry, released when the
last document of the job that references the file has been handed off. Dify asks
:func:`reserve_file_cleanup` (internal route ``GET /internal/upgrade-file-leases/<id>``) before
it deletes legacy bytes.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from upgrades.models import DocumentStatus, FileLeaseStatus, UpgradeDocument, UpgradeFileLease

FILE_LEASE_TTL = timedelta(days=7)
"""Bridge specification §1.4: 7 days from the snapshot, from every delivery and every retry."""


def extend_leases(job_id: uuid.UUID, now: datetime | None = None) -> int:
    """Move every unreleased lease of the job to ``now`` + 7 days (expired ones become active
    again); returns the number of leases moved."""
    now = now or timezone.now()
    return (
        UpgradeFileLease.objects.filter(job_id=job_id)
        .exclude(status=FileLeaseStatus.RELEASED)
        .update(status=FileLeaseStatus.ACTIVE, expires_at=now + FILE_LEASE_TTL, updated_at=now)
    )


def release_if_unreferenced(
    job_id: uuid.UUID, upload_file_id: str | None, now: datetime | None = None
) -> bool:
    """Release the job's lease on ``upload_file_id`` once no document of the job that references
    the file is still to be handed off (every one ``succeeded``); returns whether it was
    released. Call inside the transaction that marked a document ``succeeded``."""
    if not upload_file_id:
        return False
    now = now or timezone.now()
    waiting = (
        UpgradeDocument.objects.filter(job_id=job_id, upload_file_id=upload_file_id)
        .exclude(status=DocumentStatus.SUCCEEDED)
        .exists()
    )
    if waiting:
        return False
    return bool(
        UpgradeFileLease.objects.filter(job_id=job_id, upload_file_id=upload_file_id)
        .exclude(status=FileLeaseStatus.RELEASED)
        .update(status=FileLeaseStatus.RELEASED, released_at=now, updated_at=now)
    )


def live_leases(
    tenant_id: str, upload_file_id: str, now: datetime | None = None
) -> QuerySet[UpgradeFileLease]:
    """Active, unexpired leases on a legacy file of the tenant."""
    now = now or timezone.now()
    return UpgradeFileLease.objects.filter(
        Q(job__tenant_id=tenant_id),
        upload_file_id=upload_file_id,
        status=FileLeaseStatus.ACTIVE,
        expires_at__gt=now,
    )


def reserve_file_cleanup(tenant_id: str, upload_file_id: str) -> dict[str, Any]:
    """Dify asks before deleting a legacy uploaded file's bytes.

    Returns ``{"upload_file_id", "leased": bool, "expires_at": datetime | None}``: ``leased``
    is true while an active, unexpired lease of any of the tenant's upgrades holds the file
    (``expires_at`` is the latest expiry); Dify must then keep the bytes and ask again later.
    While leased, ``cleanup_requested_at`` is recorded on the live leases (visible in the
    admin), as the reference's deferred cleanup does.
    """
    now = timezone.now()
    leases = live_leases(tenant_id, upload_file_id, now)
    latest = leases.order_by("-expires_at").values_list("expires_at", flat=True).first()
    if latest is not None:
        leases.filter(cleanup_requested_at__isnull=True).update(
            cleanup_requested_at=now, updated_at=now
        )
    return {"upload_file_id": upload_file_id, "leased": latest is not None, "expires_at": latest}
