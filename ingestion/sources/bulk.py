"""One action over up to 200 sources of a space (``POST …/sources/bulk``): ``sync`` starts a
durable sync run per source, ``disable`` turns their sync policies off (compare-and-set free:
the policy revision moves on), ``remove`` deletes them (their documents are kept). Each source
gets its own outcome; one refused (a live run: ``source_run_active``, an unknown id:
``source_not_found``) never stops the others."""

from __future__ import annotations

import uuid

from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import InvalidInput, ServiceError
from spaces.models import KnowledgeSpace

from .models import Source
from .runs import MAX_ITEMS, start_sync
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


def apply(space: KnowledgeSpace, body) -> dict:
    """``{action, results: [{source_id, ok, run_id?, code?, message?}]}`` in request order."""
    action, ids = check(body)
    found = {s.id: s for s in Source.objects.filter(space=space, id__in=ids)}
    results = []
    for source_id in ids:
        source = found.get(source_id)
        entry: dict = {"source_id": str(source_id)}
        if source is None:
            results.append({**entry, "ok": False, "code": "source_not_found",
                            "message": "source not found"})  # fmt: skip
            continue
        try:
            if action == "sync":
                entry["run_id"] = str(start_sync(source, trigger="bulk").id)
            elif action == "disable":
                Source.objects.filter(id=source.id).update(
                    sync_enabled=False, next_run_at=None, sync_revision=F("sync_revision") + 1,
                    updated_at=timezone.now(),
                )  # fmt: skip
            else:
                delete_source(source)
        except ServiceError as exc:
            results.append({**entry, "ok": False, "code": exc.code, "message": exc.message})
            continue
        results.append({**entry, "ok": True})
    return {"action": action, "results": results}
