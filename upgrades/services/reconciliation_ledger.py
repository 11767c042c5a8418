"""The owed-document ledger of reconciliation: which handed-off documents of an upgrade job
still owe their availability and metadata, which are dead-lettered, and the operator's re-arm.

Owed documents are the job's ``succeeded`` hand-offs with ``state_reconciled_at`` and
``state_dead_lettered_at`` NULL. A succeeded hand-off whose new document is gone (the tenant
deleted it: the link is NULL or the row is missing) owes nothing either: nothing of it can be
served, so it is reconciled with the note ``document_deleted: …`` in ``state_reconcile_error``
instead of failing until the dead letter. Legacy documents with the same bytes are deduplicated
onto ONE new document at hand-off; they are reconciled as one group with one merged state
(enabled when any of them is desired enabled; metadata merged in legacy-document order, the
first value of a key wins) and checkpointed together with the note ``document_merged: …``
naming every overridden value.

A hand-off that **failed** owes nothing: the run links a new document only when the hand-off
succeeds, so there is nothing that could be served with the wrong availability; it shows in the
job's ``failed_documents`` and does not hold the gate.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from knowledgefs.errors import NotFound
from upgrades.models import DocumentStatus, UpgradeDocument, UpgradeJob

logger = logging.getLogger("knowledgefs.upgrades.reconciliation")


def owed_documents(job_id: uuid.UUID) -> QuerySet[UpgradeDocument]:
    """The job's document checkpoints still owed: handed off, not reconciled, not dead-lettered."""
    return UpgradeDocument.objects.filter(
        job_id=job_id,
        status=DocumentStatus.SUCCEEDED,
        state_reconciled_at__isnull=True,
        state_dead_lettered_at__isnull=True,
    )


def due_documents(job_id: uuid.UUID, now: datetime) -> QuerySet[UpgradeDocument]:
    """Owed documents a delivery may try now: never tried, or whose last failed attempt is at
    least ``KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS`` old (``updated_at``), so one
    failing document cannot spend its capped attempts on back-to-back continuations."""
    delay = timedelta(seconds=settings.KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS)
    return owed_documents(job_id).filter(
        Q(state_reconcile_attempt_count=0) | Q(updated_at__lte=now - delay)
    )


def dead_lettered_documents(job_id: uuid.UUID) -> QuerySet[UpgradeDocument]:
    """The job's handed-off documents that exhausted their attempts and are not reconciled."""
    return UpgradeDocument.objects.filter(
        job_id=job_id,
        status=DocumentStatus.SUCCEEDED,
        state_reconciled_at__isnull=True,
        state_dead_lettered_at__isnull=False,
    )


# --- operator: dead letter ----------------------------------------------------------------------
def rearm_dead_lettered(job_id: uuid.UUID, *, now: datetime | None = None) -> int:
    """Give a job's dead-lettered documents a fresh set of attempts and clear the job's dead
    letter, so the next recovery tick re-issues its lease; returns the documents re-armed.

    Raises 404 ``upgrade_job_not_found``. A job without dead letters is left as it is (0).
    """
    now = now or timezone.now()
    with transaction.atomic():
        if not UpgradeJob.objects.filter(id=job_id).exists():
            raise NotFound("upgrade job not found", code="upgrade_job_not_found")
        count = dead_lettered_documents(job_id).update(
            state_dead_lettered_at=None,
            state_reconcile_attempt_count=0,
            updated_at=now,
        )
        cleared = UpgradeJob.objects.filter(
            id=job_id, reconcile_dead_lettered_at__isnull=False
        ).update(reconcile_dead_lettered_at=None, updated_at=now)
    if count or cleared:
        logger.info("re-armed %d dead-lettered documents of upgrade job %s", count, job_id)
    return count
