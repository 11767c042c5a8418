"""Starting, listing, cancelling and retrying source runs (docs/datasources.md).

An import names 1–200 provider items (pages, drive files or crawled URLs, by the source's kind);
a sync re-reads every active item of the source. Either is one :class:`SourceRun` queued with
its items (the checkpoint), dispatched through the jobs kernel after the commit
(:mod:`.dispatch`). One run per source is live at a time (409 ``source_run_active``). Cancel
(live runs) and retry (failed or canceled runs: pending items run again, finished ones are
kept) are 409 ``source_run_finished`` / ``source_run_not_retryable`` otherwise.
"""

from __future__ import annotations

import hashlib
import json

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, NotFound
from spaces.models import KnowledgeSpace

from . import dispatch
from .models import (
    LIVE_RUN_STATES,
    ItemState,
    RunItemState,
    RunKind,
    RunState,
    Source,
    SourceKind,
    SourceRun,
    SourceRunItem,
)
from .services import check_public_url

MAX_ITEMS = 200

#: The run kind of an import, per source kind (a website imports through a crawl preview).
IMPORT_KINDS = {
    SourceKind.ONLINE_DOCUMENT: RunKind.ONLINE_DOCUMENT_IMPORT,
    SourceKind.ONLINE_DRIVE: RunKind.ONLINE_DRIVE_IMPORT,
}

#: Per kind: the members of an import item, the required ones.
ITEM_MEMBERS = {
    SourceKind.ONLINE_DOCUMENT: (
        ("page_id", "workspace_id", "type", "name"),
        ("page_id", "workspace_id"),
    ),
    SourceKind.ONLINE_DRIVE: (("id", "name", "bucket"), ("id",)),
    SourceKind.WEBSITE: (("source_url", "title"), ("source_url",)),
}


def provider_item_id(kind: str, item: dict) -> str:
    """The provider item id: a compact JSON array ``["<workspace>","<page>"]`` for pages,
    ``["<bucket>","<file>"]`` for files, the URL for crawled pages."""
    if kind == SourceKind.ONLINE_DOCUMENT:
        return json.dumps([item.get("workspace_id", ""), item["page_id"]], separators=(",", ":"))
    if kind == SourceKind.ONLINE_DRIVE:
        return json.dumps([item.get("bucket", ""), item["id"]], separators=(",", ":"))
    return item["source_url"]


def digest(provider_id: str) -> str:
    return hashlib.sha256(provider_id.encode()).hexdigest()


def check_items(source: Source, body) -> list[dict]:
    """The checked items of an import ``{items: [...]}`` (400 naming the item and member)."""
    if not isinstance(body, dict) or set(body) - {"items"}:
        raise InvalidInput("body must be {items: [...]}", code="invalid_request")
    items = body.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
        raise InvalidInput(
            f"items must list 1 to {MAX_ITEMS} items"
            + (f" ({len(items)} given)" if isinstance(items, list) else ""),
            code="too_many_items" if isinstance(items, list) and items else "invalid_items",
            details={"field": "items", "max": MAX_ITEMS},
        )
    members, required = ITEM_MEMBERS[SourceKind(source.kind)]
    checked = []
    for n, item in enumerate(items):
        field = f"items[{n}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{field} must be an object", code="invalid_items",
                               details={"field": field})  # fmt: skip
        extra = sorted(set(item) - set(members))
        if extra:
            raise InvalidInput(
                f"{field}.{extra[0]}: not a member of a {source.kind} item "
                f"(members: {', '.join(members)})",
                code="invalid_items",
                details={"field": f"{field}.{extra[0]}"},
            )
        for name in members:
            value = item.get(name)
            if value is None and name not in required:
                continue
            if not isinstance(value, str) or not value.strip() or len(value) > 1024:
                raise InvalidInput(
                    f"{field}.{name} must be a non-empty string of at most 1024 characters",
                    code="invalid_items",
                    details={"field": f"{field}.{name}"},
                )
        if source.kind == SourceKind.WEBSITE:
            check_public_url(item["source_url"], f"{field}.source_url")
        checked.append({k: v.strip() for k, v in item.items() if v is not None})
    return checked


def lock_idle(source: Source) -> Source:
    locked = Source.objects.select_for_update().get(id=source.id)
    if SourceRun.objects.filter(source=locked, state__in=LIVE_RUN_STATES).exists():
        raise Conflict(
            "a run of this source is already queued or running; wait for it or cancel it",
            code="source_run_active",
        )
    return locked


def start_import(source: Source, body, *, trigger: str = "api") -> SourceRun:
    """Queue an import of the items in ``body``; returns the queued run (202). A website
    imports a crawl preview's frozen selection instead (:mod:`.preview`)."""
    if source.kind == SourceKind.WEBSITE:
        raise InvalidInput(
            "a website import is {preview_run_id, urls: [...]}: run POST …/crawl-preview first",
            code="crawl_preview_required",
            details={"field": "preview_run_id"},
        )
    items = check_items(source, body)
    with transaction.atomic():
        locked = lock_idle(source)
        run = SourceRun.objects.create(
            tenant_id=locked.tenant_id, space_id=locked.space_id, source=locked,
            kind=IMPORT_KINDS[SourceKind(locked.kind)], trigger=trigger, progress_total=None,
        )  # fmt: skip
        seen: set[str] = set()
        rows: list[SourceRunItem] = []
        for item in items:
            pid = provider_item_id(locked.kind, item)
            if digest(pid) in seen:
                continue
            seen.add(digest(pid))
            rows.append(
                SourceRunItem(
                    run=run,
                    ordinal=len(rows),
                    provider_item_id=pid,
                    item_digest=digest(pid),
                    payload=item,
                )  # fmt: skip
            )
        SourceRunItem.objects.bulk_create(rows)
        SourceRun.objects.filter(id=run.id).update(progress_total=len(rows))
        dispatch.QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run


def start_sync(source: Source, *, trigger: str = "api") -> SourceRun:
    """Queue a sync of the source's active items (its items are staged by the run's provider
    read); returns the queued run (202)."""
    with transaction.atomic():
        locked = lock_idle(source)
        run = SourceRun.objects.create(
            tenant_id=locked.tenant_id, space_id=locked.space_id, source=locked,
            kind=RunKind.SYNC, trigger=trigger,
        )  # fmt: skip
        dispatch.QUEUE.dispatch_on_commit(run.id)
    return run


def runs_in(space: KnowledgeSpace, *, source_id=None) -> QuerySet[SourceRun]:
    runs = SourceRun.objects.filter(space=space)
    if source_id is not None:
        runs = runs.filter(source_id=source_id)
    return runs.order_by("-created_at", "-id")


def get_run(source: Source, run_id) -> SourceRun:
    """The run ``run_id`` of ``source`` (404 ``source_run_not_found`` otherwise)."""
    run = SourceRun.objects.get_in_space(source.space, run_id, what="source run")
    if run.source_id != source.id:
        raise NotFound("source run not found", code="source_run_not_found")
    return run


def get_space_run(space: KnowledgeSpace, run_id) -> SourceRun:
    """Any source run of the space, bulk runs included (404 ``source_run_not_found``)."""
    return SourceRun.objects.get_in_space(space, run_id, what="source run")


def cancel_run(run: SourceRun) -> SourceRun:
    """Cancel a queued or running run: its delivery's fenced writes match nothing from now on
    (the item being read finishes, no further one starts)."""
    now = timezone.now()
    changed = SourceRun.objects.filter(id=run.id, state__in=LIVE_RUN_STATES).update(
        state=RunState.CANCELED, task_id=None, claimed_at=None, step_started_at=None,
        error_code="canceled", error_message="canceled by request", completed_at=now,
        updated_at=now,
    )  # fmt: skip
    if not changed:
        raise Conflict(f"the run already ended ({run.state})", code="source_run_finished")
    run.refresh_from_db()
    return run


def retry_run(run: SourceRun) -> SourceRun:
    """Queue a failed or canceled run again: its pending and failed items run, the finished
    ones are kept (a sync re-reads the provider when it never got past its provider read)."""
    with transaction.atomic():
        if run.source is not None:  # a bulk run names no source of its own
            lock_idle(run.source)
        now = timezone.now()
        changed = SourceRun.objects.filter(
            id=run.id, state__in=(RunState.FAILED, RunState.CANCELED)
        ).update(
            state=RunState.QUEUED, task_id=None, claimed_at=None, step_started_at=None,
            attempt_count=0, retry_at=None, error_code="", error_message="", completed_at=None,
            updated_at=now,
        )  # fmt: skip
        if not changed:
            raise Conflict(
                f"only a failed or canceled run can be retried (this one is {run.state})",
                code="source_run_not_retryable",
            )
        failed = SourceRunItem.objects.filter(run=run, state=RunItemState.FAILED)
        count = failed.update(state=RunItemState.PENDING, error_code="", error_message="")
        if count:
            from django.db.models import F

            SourceRun.objects.filter(id=run.id).update(progress_failed=F("progress_failed") - count)
        dispatch.QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run


def staged_items(source: Source):
    """The items a sync compares: active ones, and disabled ones not yet removed (one that
    comes back at the provider is enabled again)."""
    return source.items.filter(state__in=(ItemState.ACTIVE, ItemState.DISABLED)).order_by(
        "created_at", "id"
    )
