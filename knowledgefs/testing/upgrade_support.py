"""Helpers of the upgrade tests: a snapshot body, the inner-key client, and a synchronous driver
that delivers the queued step messages of the ORM broker one by one."""

from __future__ import annotations

import uuid
from typing import Any

from django_q.models import OrmQ
from django_q.signing import SignedPackage
from rest_framework.test import APIClient

from knowledgefs import storage

INNER_KEY = "inner-key-for-upgrade-tests-0123456789"
STEP_FUNC = "upgrades.tasks.run_upgrade_step"
RECONCILE_FUNC = "upgrades.reconciliation_tasks.reconcile_documents"


def inner() -> APIClient:
    api = APIClient()
    api.credentials(HTTP_X_INNER_API_KEY=INNER_KEY)
    return api


def legacy_file(
    name: str, data: bytes, *, doc_id: str | None = None, **fields: Any
) -> dict[str, Any]:
    """Put ``data`` into the object storage as a legacy upload; returns its snapshot entry."""
    upload_file_id = fields.pop("upload_file_id", None) or f"uf-{uuid.uuid4().hex[:12]}"
    key = fields.pop("storage_key", None) or f"upload_files/tenant-a/{upload_file_id}"
    if data is not None:
        storage.put_object(key, data)
    return {
        "id": doc_id or f"doc-{uuid.uuid4().hex[:12]}",
        "name": name,
        "data_source_type": "upload_file",
        "storage_key": key,
        "upload_file_id": upload_file_id,
        "desired_enabled": True,
        "archived": False,
        "indexing_status": "completed",
        "metadata": {"author": "Ada"},
        **fields,
    }


def snapshot_body(documents: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    body = {
        "namespace_id": "tenant-a",
        "dataset_id": "ds-1",
        "idempotency_key": "click-1",
        "requested_by": "acct-1",
        "owner": "acct-2",
        "config": {"name": "Handbook", "description": "HR handbook", "enable_api": True},
        "permission": {"visibility": "only_me", "member_ids": ["acct-3"]},
        "app_bindings": [{"app_id": "app-1", "kind": "agent"}],
        "tag_ids": ["tag-1"],
        "documents": documents,
    }
    body.update(overrides)
    return body


def messages(func: str = STEP_FUNC) -> list[tuple[int, tuple[Any, ...]]]:
    """(message id, args) of the waiting ORM broker messages of ``func``."""
    found = []
    for message in OrmQ.objects.order_by("id"):
        task = SignedPackage.loads(message.payload)
        if task["func"] == func:
            found.append((message.id, tuple(task["args"])))
    return found


def deliver_all(limit: int = 200) -> list[str]:
    """Deliver the waiting step messages (taking each off the queue) until none is left;
    returns each delivery's result."""
    from upgrades.tasks import run_upgrade_step

    results: list[Any] = []
    for _ in range(limit):
        waiting = messages()
        if not waiting:
            return results
        message_id, args = waiting[0]
        OrmQ.objects.filter(id=message_id).delete()
        results.append(run_upgrade_step(*args))
    raise AssertionError(f"still delivering after {limit} steps: {results[-10:]}")
