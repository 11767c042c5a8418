"""Sync policies (``GET/PUT …/sources/{sid}/sync-policy``) and the schedule that runs them.

A policy is ``mode`` ``manual`` (never scheduled), ``interval`` (every 86,400 s) or ``custom``
(``custom_interval_seconds`` 3,600–2,592,000), and ``enabled``. A PUT names the
``expected_revision`` it read (409 ``revision_conflict`` otherwise) and sets ``next_run_at``
(now + the interval, or nothing). Every minute :func:`start_due` takes a bounded batch
(``KNOWLEDGE_SOURCE_SCHEDULE_BATCH``) of enabled sources whose ``next_run_at`` has passed,
oldest first, moves each one's ``next_run_at`` on and starts its sync (a source with a live run
is left to it), then removes the documents of items disabled longer than
``KNOWLEDGE_SOURCE_RETENTION_DAYS``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput

from .models import ItemState, Source, SourceItem, SyncMode

logger = logging.getLogger("knowledgefs.sources")

DEFAULT_INTERVAL_SECONDS = 86_400
MIN_CUSTOM_SECONDS = 3_600
MAX_CUSTOM_SECONDS = 2_592_000
PUT_MEMBERS = ("mode", "enabled", "custom_interval_seconds", "expected_revision")


def policy_of(source: Source) -> dict:
    return {
        "mode": source.sync_mode,
        "enabled": source.sync_enabled,
        "custom_interval_seconds": source.sync_interval_seconds
        if source.sync_mode == SyncMode.CUSTOM
        else None,
        "interval_seconds": interval_of(source.sync_mode, source.sync_interval_seconds),
        "next_run_at": source.next_run_at.isoformat() if source.next_run_at else None,
        "last_synced_at": source.last_synced_at.isoformat() if source.last_synced_at else None,
        "revision": source.sync_revision,
    }


def interval_of(mode: str, custom: int | None) -> int | None:
    if mode == SyncMode.INTERVAL:
        return DEFAULT_INTERVAL_SECONDS
    if mode == SyncMode.CUSTOM:
        return custom
    return None


def _bad(field: str, message: str, code: str = "invalid_sync_policy") -> InvalidInput:
    return InvalidInput(f"{field}: {message}", code=code, details={"field": field})


def put_policy(source: Source, body) -> dict:
    """Replace the policy by compare-and-set on ``expected_revision``; returns the policy."""
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(PUT_MEMBERS))
    if unknown:
        raise _bad(unknown[0], f"not a sync-policy member ({', '.join(PUT_MEMBERS)})")
    mode = body.get("mode")
    if mode not in SyncMode.values:
        raise _bad("mode", f"one of {', '.join(SyncMode.values)}")
    enabled = body.get("enabled")
    if not isinstance(enabled, bool):
        raise _bad("enabled", "true or false")
    expected = body.get("expected_revision")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise _bad("expected_revision", "the policy's revision you read (an integer ≥ 1)")
    custom = body.get("custom_interval_seconds")
    if mode == SyncMode.CUSTOM:
        if (
            isinstance(custom, bool)
            or not isinstance(custom, int)
            or not MIN_CUSTOM_SECONDS <= custom <= MAX_CUSTOM_SECONDS
        ):
            raise _bad(
                "custom_interval_seconds",
                f"an integer from {MIN_CUSTOM_SECONDS} to {MAX_CUSTOM_SECONDS} for mode custom",
            )
    elif custom is not None:
        raise _bad("custom_interval_seconds", "only with mode custom")
    interval = interval_of(mode, custom)
    now = timezone.now()
    next_run = now + timedelta(seconds=interval) if enabled and interval else None
    changed = Source.objects.filter(id=source.id, sync_revision=expected).update(
        sync_mode=mode, sync_enabled=enabled and interval is not None,
        sync_interval_seconds=custom if mode == SyncMode.CUSTOM else None,
        sync_revision=F("sync_revision") + 1, next_run_at=next_run, updated_at=now,
    )  # fmt: skip
    source.refresh_from_db()
    if not changed:
        raise Conflict(
            f"the sync policy changed since revision {expected} (it is at {source.sync_revision});"
            " read it again",
            code="revision_conflict",
            details={"revision": source.sync_revision},
        )
    return policy_of(source)


def start_due(*, now=None, batch: int | None = None) -> dict[str, int]:
    """Start the due syncs (a bounded batch) and purge items past the retention."""
    from .runs import start_sync

    now = now or timezone.now()
    batch = batch or settings.KNOWLEDGE_SOURCE_SCHEDULE_BATCH
    due = list(
        Source.objects.filter(sync_enabled=True, next_run_at__lte=now)
        .order_by("next_run_at", "id")
        .values_list("id", "next_run_at", "sync_mode", "sync_interval_seconds")[:batch]
    )
    started = busy = 0
    for source_id, next_run_at, mode, custom in due:
        if next_run_at is None:  # not due; next_run_at__lte never matches NULL anyway
            continue
        interval = interval_of(mode, custom) or DEFAULT_INTERVAL_SECONDS
        following = max(next_run_at + timedelta(seconds=interval), now)
        # Claim this turn by compare-and-set, so two schedulers never start it twice.
        if not Source.objects.filter(id=source_id, next_run_at=next_run_at).update(
            next_run_at=following
        ):
            continue
        try:
            start_sync(Source.objects.get(id=source_id), trigger="schedule")
            started += 1
        except Conflict:
            busy += 1  # a run is live: this turn is left to it
    return {"due": len(due), "started": started, "busy": busy, "purged": purge_disabled(now=now)}


def purge_disabled(*, now=None, batch: int = 200) -> int:
    """Delete the documents (and items) of items disabled longer than the retention."""
    from ingestion.documents import purge_documents
    from ingestion.models import Document

    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.KNOWLEDGE_SOURCE_RETENTION_DAYS)
    items = list(
        SourceItem.objects.filter(state=ItemState.DISABLED, disabled_at__lte=cutoff)
        .order_by("disabled_at")
        .values_list("id", "document_id")[:batch]
    )
    if not items:
        return 0
    document_ids = [d for _, d in items if d]
    if document_ids:
        purge_documents(Document.objects.filter(id__in=document_ids))
    with transaction.atomic():
        SourceItem.objects.filter(id__in=[i for i, _ in items]).delete()
    logger.info("removed %s source items gone past the retention", len(items))
    return len(items)
