"""One action over up to 200 sources of a space (``POST …/sources/bulk``) as a durable run of
kind ``bulk`` (202, ``Idempotency-Key``): ``sync`` starts a durable sync run per source,
``disable`` turns their sync policies off (compare-and-set free: the policy revision moves on),
``remove`` deletes them (their documents are kept).

The run has one item per source (its checkpoint, in request order) and goes through the same
run queue as the other source runs (claim, lease, sweep, cancel, retry). Each source's action
and its item's outcome are written in one transaction under the delivery's fence, so a worker
killed mid-run resumes with the pending sources only: a finished source is never acted on
twice. Each source gets its own outcome; one refused (a live run: ``source_run_active``, an
unknown or deleted id: ``source_not_found``) never stops the others."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import InvalidInput, ServiceError
from spaces.models import KnowledgeSpace

from . import dispatch
from .materialize import mark
from .models import RunItemState, RunKind, Source, SourceRun, SourceRunItem
from .runs import MAX_ITEMS, digest, start_sync
from .services import delete_source

ACTIONS = ("sync", "disable", "remove")


def check(body) -> tuple[str, list[uuid.UUID]]:
    if not isinstance(body, dict) or set(body) - {"action", "source_ids"}:
        raise InvalidInput("body must be {action, source_ids}", code="invalid_request")
    action = body.get("action")
    if action not in ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}", code="invalid_request",
                           details={"field": "action"})  # fmt: skip
    ids = body.get("source_ids")
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_ITEMS:
        raise InvalidInput(
            f"source_ids must list 1 to {MAX_ITEMS} source ids",
            code="too_many_items" if isinstance(ids, list) and ids else "invalid_request",
            details={"field": "source_ids", "max": MAX_ITEMS},
        )
    parsed = []
    for n, raw in enumerate(ids):
        try:
            parsed.append(uuid.UUID(str(raw)))
        except ValueError:
            raise InvalidInput(f"source_ids[{n}] is not a source id", code="invalid_request",
                               details={"field": f"source_ids[{n}]"}) from None  # fmt: skip
    return action, list(dict.fromkeys(parsed))


def start_bulk(space: KnowledgeSpace, body, *, trigger: str = "api") -> SourceRun:
    """Queue the bulk action of ``body``; returns the queued run (202)."""
    action, ids = check(body)
    with transaction.atomic():
        run = SourceRun.objects.create(
            tenant_id=space.tenant_id, space=space, source=None, kind=RunKind.BULK,
            trigger=trigger, progress_total=len(ids),
        )  # fmt: skip
        SourceRunItem.objects.bulk_create(
            SourceRunItem(
                run=run,
                ordinal=n,
                provider_item_id=str(source_id),
                item_digest=digest(str(source_id)),
                payload={"action": action},
            )  # fmt: skip
            for n, source_id in enumerate(ids)
        )
        dispatch.QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run


def deliver(run: SourceRun, task_id: str) -> None:
    """Apply the action to each pending source of the run, in request order."""
    pending = SourceRunItem.objects.filter(run=run, state=RunItemState.PENDING)
    for item in pending.order_by("ordinal"):
        _apply_one(run, task_id, item)


def _apply_one(run: SourceRun, task_id: str, item: SourceRunItem) -> None:
    action = item.payload.get("action")
    with transaction.atomic():
        source = (
            Source.objects.select_for_update()
            .filter(space_id=run.space_id, id=item.provider_item_id)
            .first()
        )
        if source is None:
            mark(run, task_id, item, RunItemState.FAILED, error_code="source_not_found",
                 error_message="source not found")  # fmt: skip
            return
        outcome: dict = {}
        try:
            with transaction.atomic():
                if action == "sync":
                    outcome["run_id"] = str(start_sync(source, trigger="bulk").id)
                elif action == "disable":
                    Source.objects.filter(id=source.id).update(
                        sync_enabled=False, next_run_at=None,
                        sync_revision=F("sync_revision") + 1, updated_at=timezone.now(),
                    )  # fmt: skip
                else:
                    delete_source(source)
        except ServiceError as exc:
            mark(run, task_id, item, RunItemState.FAILED, error_code=exc.code[:64],
                 error_message=exc.message[:2000])  # fmt: skip
            return
        mark(run, task_id, item, RunItemState.DONE, payload={**item.payload, **outcome})


def results_of(run: SourceRun) -> list[dict]:
    """Each source's outcome, in request order: ``{source_id, state, run_id?, code?,
    message?}`` (``state`` pending, done or failed)."""
    results = []
    for item in SourceRunItem.objects.filter(run=run).order_by("ordinal"):
        entry = {"source_id": item.provider_item_id, "state": item.state}
        if item.payload.get("run_id"):
            entry["run_id"] = item.payload["run_id"]
        if item.error_code:
            entry.update(code=item.error_code, message=item.error_message)
        results.append(entry)
    return results
