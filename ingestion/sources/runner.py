"""One delivery of a source run: start it (the kernel's compare-and-set), read the provider once
(checkpoint ``provider-read``: the run's items staged), then materialize each *pending* item in
order (:mod:`.materialize`), and finish ``completed`` (checkpoint ``source-committed``).

A later delivery (the sweep's requeue after a killed worker, a retry) continues with the pending
items only, so nothing finished is imported twice. A retryable Dify failure (429, 5xx, a timeout)
puts the run back to ``queued`` with a back-off (``retry_at``; the sweep dispatches it once
due) until ``KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS`` deliveries, then fails it
``datasource_unavailable``. Dify's 403 fails it ``source_credential_forbidden``; a connection the
plugin refuses fails it ``source_credential_invalid`` at the provider read, before any item is
touched, so nothing is disabled or removed.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from knowledgefs.dify.errors import DatasourceError
from knowledgefs.errors import ServiceError

from . import bulk, dispatch, preview
from .browse import provider_listing
from .materialize import RunFailure, process
from .models import (
    Checkpoint,
    ItemState,
    RunItemState,
    RunKind,
    RunState,
    Source,
    SourceKind,
    SourceRunItem,
)
from .runs import staged_items
from .services import call_args, client

logger = logging.getLogger("knowledgefs.sources")


def run_delivery(run_pk: str, task_id: str) -> str:
    """Run the source run if ``task_id`` still claims it; returns what happened."""
    run = dispatch.QUEUE.begin(run_pk, task_id)
    if run is None:
        return "skipped"
    try:
        if run.kind == RunKind.BULK:
            bulk.deliver(run, task_id)
            _finish(run, task_id)
            return "completed"
        datasources = client()
        if run.kind == RunKind.CRAWL_PREVIEW:
            if run.checkpoint == Checkpoint.QUEUED:
                _provider_read(lambda: preview.list_into(run, task_id, datasources), run.source,
                               datasources)  # fmt: skip
        elif run.checkpoint == Checkpoint.QUEUED:
            _stage(run, task_id, datasources)
        for run_item in SourceRunItem.objects.filter(run=run, state=RunItemState.PENDING).order_by(
            "ordinal"
        ):
            process(run, task_id, run_item, datasources)
        _finish(run, task_id)
        return "completed"
    except dispatch.ClaimLost:
        return "lost"
    except RunFailure as exc:
        dispatch.QUEUE.fail(run.id, task_id, exc.code, exc.message)
        return "failed"
    except DatasourceError as exc:
        return _dify_failed(run, task_id, exc)
    except ServiceError as exc:  # datasources_unavailable: Dify not configured
        dispatch.QUEUE.fail(run.id, task_id, exc.code, exc.message)
        return "failed"


def _stage(run, task_id: str, datasources) -> None:
    """The provider read: a sync stages every active item of the source against what the
    provider lists now; an import completes its items with what the listing says (a page's
    last-edited time, a crawled page's content)."""
    source = run.source
    listing = None
    if run.kind == RunKind.SYNC or source.kind != SourceKind.ONLINE_DRIVE:
        listing = _provider_read(lambda: provider_listing(source, datasources), source,
                                 datasources)  # fmt: skip
    with transaction.atomic():
        now = timezone.now()
        if not dispatch.QUEUE.held(run.id, task_id).update(
            checkpoint=Checkpoint.PROVIDER_READ, step_started_at=now, updated_at=now
        ):
            raise dispatch.ClaimLost(str(run.id))
        if run.kind == RunKind.SYNC:
            if listing is None:  # read above for every sync
                raise ValueError(f"sync run {run.id} has no provider listing to stage against")
            rows: list[SourceRunItem] = []
            for item in staged_items(source):
                found = listing.get(item.provider_item_id)
                if found is None and item.state != ItemState.ACTIVE:
                    continue  # gone already: the retention removes it
                payload = {**item.detail, **(found or {}), "gone": found is None}
                rows.append(
                    SourceRunItem(
                        run=run,
                        ordinal=len(rows),
                        provider_item_id=item.provider_item_id,
                        item_digest=item.item_digest,
                        payload=payload,
                    )
                )
            SourceRunItem.objects.bulk_create(rows, batch_size=500)
            dispatch.QUEUE.held(run.id, task_id).update(progress_total=len(rows))
        elif listing is not None:
            for run_item in SourceRunItem.objects.filter(run=run, state=RunItemState.PENDING):
                found = listing.get(run_item.provider_item_id)
                payload = {**(found or {}), **run_item.payload, "gone": found is None}
                if found and found.get("last_edited_time"):
                    payload["last_edited_time"] = found["last_edited_time"]
                SourceRunItem.objects.filter(id=run_item.id).update(payload=payload)


def _provider_read(call, source: Source, datasources):
    """``call()``, a provider read: an error answer is checked against the connection."""
    try:
        return call()
    except DatasourceError as exc:
        if exc.code == DatasourceError.CODES["error"] and not exc.retryable:
            raise _refused(source, datasources) from None
        raise


def _refused(source: Source, datasources) -> RunFailure:
    """The provider read answered an error: is the connection itself refused?"""
    try:
        valid = datasources.validate_credentials(
            source.credential_id, datasource_type=source.datasource_type, **call_args(source)
        )
    except DatasourceError:
        valid = False
    if not valid:
        return RunFailure(
            "source_credential_invalid",
            "Dify's connection for this source no longer works (expired or revoked); "
            "reconnect it in Dify; nothing was changed",
        )
    return RunFailure("source_provider_error", "the provider could not list this source")


def _dify_failed(run, task_id: str, exc: DatasourceError) -> str:
    if exc.status == 403:
        dispatch.QUEUE.fail(
            run.id, task_id, "source_credential_forbidden",
            "Dify refused this datasource connection to this workspace (403); nothing was changed",
        )  # fmt: skip
        return "failed"
    if not exc.retryable:
        dispatch.QUEUE.fail(run.id, task_id, "source_provider_error", f"Dify answered {exc.code}")
        return "failed"
    attempts = run.attempt_count
    if attempts >= settings.KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS:
        dispatch.QUEUE.fail(
            run.id, task_id, "datasource_unavailable",
            f"Dify's datasource kept failing ({exc.code}) after {attempts} attempts; retry the "
            "run later",
        )  # fmt: skip
        return "failed"
    delay = min(
        settings.KNOWLEDGE_SOURCE_RETRY_MAX_SECONDS,
        settings.KNOWLEDGE_SOURCE_RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1),
    )
    now = timezone.now()
    dispatch.QUEUE.held(run.id, task_id).update(
        state=RunState.QUEUED, task_id=None, claimed_at=None, step_started_at=None,
        retry_at=now + timedelta(seconds=delay), error_code="datasource_unavailable",
        error_message=f"Dify's datasource failed ({exc.code}); retrying in {delay} s",
        updated_at=now,
    )  # fmt: skip
    logger.info("source run %s backs off %s s after %s", run.id, delay, exc.code)
    return "retry"


def _finish(run, task_id: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        if not dispatch.QUEUE.held(run.id, task_id).update(
            state=RunState.COMPLETED, checkpoint=Checkpoint.SOURCE_COMMITTED, task_id=None,
            claimed_at=None, step_started_at=None, completed_at=now, updated_at=now,
            error_code="", error_message="",
        ):  # fmt: skip
            raise dispatch.ClaimLost(str(run.id))
        Source.objects.filter(id=run.source_id).update(last_synced_at=now)
