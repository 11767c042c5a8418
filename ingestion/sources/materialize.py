"""One item of a source run: read it through Dify (only when the change rules say so), compare,
and make it a document, a candidate revision, a skip or a disabled document.

Change detection (docs/datasources.md, "Change detection"):

* **online documents**: the page's ``last_edited_time`` against the one recorded; the same →
  unchanged without reading the content; otherwise the content is read and its SHA-256
  compared (an edit that changed nothing is still unchanged);
* **websites**: the crawled content's SHA-256 per URL;
* **drives**: the provider's SHA-256 checksum, when it sends one, equal to the recorded hash →
  unchanged without a download; an etag counts only when it equals the one recorded after a
  real download (weak ``W/`` etags never); a modification time never; otherwise the file is
  downloaded and its SHA-256 compared.

A changed item becomes a candidate revision (:func:`ingestion.documents.replace_document`) that
swaps in only when it compiles; an item gone at the provider has its document disabled (removed
after ``KNOWLEDGE_SOURCE_RETENTION_DAYS``); unchanged items create no job (no embedding).

Every outcome is written with a fenced write on the run (:func:`mark`): a delivery that lost
its run (canceled, taken back by the sweep) writes nothing, and an admission's rows roll back
with it, so an item is never materialized twice.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import unicodedata
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ingestion import availability, documents
from ingestion.models import Document
from knowledgefs.dify.errors import DatasourceError
from knowledgefs.errors import ServiceError

from . import dispatch
from .models import ItemState, RunItemState, SourceItem, SourceKind, SourceRun, SourceRunItem
from .services import call_args

PROGRESS = {
    RunItemState.IMPORTED: "progress_completed",
    RunItemState.UPDATED: "progress_completed",
    RunItemState.DISABLED: "progress_completed",
    RunItemState.UNCHANGED: "progress_skipped",
    RunItemState.FAILED: "progress_failed",
    RunItemState.DONE: "progress_completed",
}


class RunFailure(Exception):
    """The whole run fails with ``code`` (the credential refused, the connection gone)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Read:
    """What was read of an item: its bytes, the filename to admit them under, what to record."""

    data: bytes
    filename: str
    etag: str = ""
    last_edited: str = ""


def mark(
    run: SourceRun, task_id: str, run_item: SourceRunItem, state: RunItemState, **fields
) -> None:
    """Record ``run_item``'s outcome under the delivery's fence (inside a transaction)."""
    now = timezone.now()
    fenced = dispatch.QUEUE.held(run.id, task_id).update(
        step_started_at=now, updated_at=now, **{PROGRESS[state]: F(PROGRESS[state]) + 1}
    )
    if not fenced:
        raise dispatch.ClaimLost(str(run.id))
    SourceRunItem.objects.filter(id=run_item.id).update(state=state, **fields)


def display_name(value: str, suffix: str = "") -> str:
    """A filename from a provider's name: control characters dropped, at most 200 characters."""
    name = "".join(c for c in value if unicodedata.category(c) not in ("Cc", "Cf", "Cs"))
    name = name.strip()[:200] or "untitled"
    return name if not suffix or name.lower().endswith(suffix) else name + suffix


def _item_error(exc: DatasourceError) -> tuple[str, str]:
    if exc.code == DatasourceError.CODES["too_large"]:
        return "source_item_too_large", "the item's answer from Dify is over 8 MiB"
    if exc.code == DatasourceError.CODES["error"]:
        return "source_item_unreadable", "the provider could not read the item (gone or refused)"
    return "source_item_invalid", f"Dify answered something unusable for the item ({exc.code})"


def process(run: SourceRun, task_id: str, run_item: SourceRunItem, client) -> str:
    """Materialize one pending item; returns its state. Retryable Dify failures and a 403 are
    raised to the run (back-off, or failure)."""
    source = run.source
    if source is None:  # a bulk run's items are applied by bulk.deliver, never read here
        raise ValueError(f"source run {run.id} ({run.kind}) has no source to read items from")
    payload = run_item.payload
    item = SourceItem.objects.filter(source=source, item_digest=run_item.item_digest).first()
    if payload.get("gone"):
        if run.kind == "sync" and item is not None:
            return _disable(run, task_id, run_item, item)
        return _fail(run, task_id, run_item, "source_item_not_found",
                     "the provider does not list this item")  # fmt: skip
    if item is not None and _unchanged_without_reading(source.kind, item, payload):
        return _unchanged(run, task_id, run_item, item, payload)
    try:
        read = _read(source, payload, client)
    except DatasourceError as exc:
        if exc.retryable or exc.status == 403:
            raise
        return _fail(run, task_id, run_item, *_item_error(exc))
    sha256 = hashlib.sha256(read.data).hexdigest()
    if item is not None and item.document_id and item.sha256 == sha256:
        return _unchanged(run, task_id, run_item, item, payload, read)
    return _admit(run, task_id, run_item, item, read, sha256)


def _unchanged_without_reading(kind: str, item: SourceItem, payload: dict) -> bool:
    if not item.document_id:
        return False
    if kind == SourceKind.ONLINE_DOCUMENT:
        edited = payload.get("last_edited_time") or ""
        return bool(edited) and edited == item.last_edited
    if kind == SourceKind.ONLINE_DRIVE:
        checksum = (payload.get("checksum") or {}).get("sha256") or ""
        if checksum and item.sha256 and checksum.lower() == item.sha256:
            return True
        etag = payload.get("etag") or ""
        return bool(etag) and not etag.startswith("W/") and etag != "null" and etag == item.etag
    return False  # websites: the content is compared


def _read(source, payload: dict, client) -> Read:
    args = call_args(source)
    if source.kind == SourceKind.WEBSITE:
        content = payload.get("content")
        if not isinstance(content, str):
            raise DatasourceError.of("invalid", "the crawl gave no content for this page")
        name = payload.get("title") or payload["source_url"]
        return Read(content.encode(), display_name(name, ".md"))
    if source.kind == SourceKind.ONLINE_DOCUMENT:
        result = client.page_content(
            source.credential_id, workspace_id=payload.get("workspace_id") or "-",
            page_id=payload["page_id"], page_type=payload.get("type") or "page", **args,
        )  # fmt: skip
        content = result.get("content")
        if not isinstance(content, str):
            raise DatasourceError.of("invalid", "page content is not text")
        name = payload.get("name") or payload["page_id"]
        return Read(content.encode(), display_name(name, ".md"),
                    last_edited=payload.get("last_edited_time") or "")  # fmt: skip
    result = client.download(
        source.credential_id, file_id=payload["id"], bucket=payload.get("bucket"), **args
    )
    try:
        data = base64.b64decode(result.get("content_base64") or "", validate=True)
    except (binascii.Error, ValueError):
        raise DatasourceError.of("invalid", "the download is not base64") from None
    name = result.get("file_name") or payload.get("name") or payload["id"]
    etag = payload.get("etag") or ""
    return Read(data, display_name(str(name)), etag=etag if not etag.startswith("W/") else "")


def _record(read: Read | None, payload: dict) -> dict:
    fields = {}
    if read is not None and read.etag:
        fields["etag"] = read.etag[:1024]
    edited = (read.last_edited if read else "") or payload.get("last_edited_time") or ""
    if edited:
        fields["last_edited"] = edited[:64]
    return fields


def _unchanged(run, task_id, run_item, item, payload, read: Read | None = None) -> str:
    with transaction.atomic():
        mark(run, task_id, run_item, RunItemState.UNCHANGED, document_id=item.document_id)
        fields = _record(read, payload)
        if item.state == ItemState.DISABLED:  # back at the provider: its document serves again
            _set_enabled(item.document_id, True)
            fields.update(state=ItemState.ACTIVE, disabled_at=None)
        if fields:
            SourceItem.objects.filter(id=item.id).update(**fields)
    return RunItemState.UNCHANGED


def _fail(run, task_id, run_item, code: str, message: str) -> str:
    with transaction.atomic():
        mark(run, task_id, run_item, RunItemState.FAILED, error_code=code[:64],
             error_message=message[:2000])  # fmt: skip
    return RunItemState.FAILED


def _disable(run, task_id, run_item, item: SourceItem) -> str:
    with transaction.atomic():
        mark(run, task_id, run_item, RunItemState.DISABLED, document_id=item.document_id)
        _set_enabled(item.document_id, False)
        SourceItem.objects.filter(id=item.id).update(
            state=ItemState.DISABLED, disabled_at=timezone.now()
        )
    return RunItemState.DISABLED


def _set_enabled(document_id, enabled: bool) -> None:
    """Turn the item's document on or off (its availability, compare-and-set on the version
    read in this transaction)."""
    if not document_id:
        return
    version = Document.objects.filter(id=document_id).values_list("row_version", flat=True).first()
    if version is not None:
        availability.set_document_availability(document_id, enabled, version)


def _admit(run, task_id, run_item, item: SourceItem | None, read: Read, sha256: str) -> str:
    source = run.source
    state = RunItemState.IMPORTED if item is None or not item.document_id else RunItemState.UPDATED

    def bind(document, job) -> None:
        mark(run, task_id, run_item, state, document_id=document.id)
        fields = {
            "document": document,
            "sha256": sha256,
            "name": read.filename,
            "state": ItemState.ACTIVE,
            "disabled_at": None,
            **_record(read, run_item.payload),
        }
        if item is None:
            SourceItem.objects.create(
                source=source, provider_item_id=run_item.provider_item_id,
                item_digest=run_item.item_digest, detail=_detail(run_item.payload), **fields,
            )  # fmt: skip
        else:
            SourceItem.objects.filter(id=item.id).update(**fields)
        if item is not None and item.state == ItemState.DISABLED:
            _set_enabled(document.id, True)

    try:
        # UPDATED: the item has a document (``state`` above).
        if state == RunItemState.UPDATED and item is not None and item.document_id is not None:
            document = Document.objects.filter(id=item.document_id).first()
            if document is None:
                state = RunItemState.IMPORTED
                item.document_id = None
            else:
                documents.replace_document(document, filename=read.filename, data=read.data,
                                           bind=bind)  # fmt: skip
                return state
        documents.admit_document(
            source.space, filename=read.filename, data=read.data, bind=bind,
            metadata={"source_id": str(source.id), "source_item": run_item.provider_item_id[:512]},
        )  # fmt: skip
    except ServiceError as exc:
        return _fail(run, task_id, run_item, exc.code, exc.message)
    return state


def _detail(payload: dict) -> dict:
    keep = ("workspace_id", "page_id", "type", "id", "bucket", "source_url")
    return {k: payload[k] for k in keep if k in payload}
