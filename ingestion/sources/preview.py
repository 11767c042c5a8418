"""Crawl previews of website sources and the import of their frozen selection
(docs/datasources.md, "Crawl preview").

``POST …/crawl-preview`` queues a durable run of kind ``crawl-preview``: its delivery crawls the
site once through Dify and records one run item per page (``listed``: URL, title, SHA-256 and
size of the content) without keeping any content. ``GET …/runs/{run}`` pages through them.
``POST …/imports {preview_run_id, urls[1–200]}`` then queues a ``crawl-import`` run of exactly
those URLs, which must all be in the (completed) preview: anything else is 400
``source_selection_not_in_preview`` naming them. The import crawls again for the content and
imports only the frozen selection; a page the crawl no longer lists fails alone
(``source_item_not_found``).
"""

from __future__ import annotations

import hashlib
import uuid

from django.db import transaction
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, NotFound

from . import dispatch
from .browse import crawled_pages
from .models import (
    Checkpoint,
    RunItemState,
    RunKind,
    RunState,
    Source,
    SourceKind,
    SourceRun,
    SourceRunItem,
)
from .runs import MAX_ITEMS, digest, lock_idle
from .services import check_public_url

MAX_PAGE_LIMIT = 200
#: How many unknown URLs a refused selection names in its message (all are in ``details``).
NAMED_IN_MESSAGE = 5


def _website(source: Source) -> None:
    if source.kind != SourceKind.WEBSITE:
        raise InvalidInput("only a website source has a crawl preview", code="source_kind_mismatch")


def start_preview(source: Source, *, trigger: str = "api") -> SourceRun:
    """Queue a crawl preview of a website source; returns the queued run (202)."""
    _website(source)
    with transaction.atomic():
        locked = lock_idle(source)
        run = SourceRun.objects.create(
            tenant_id=locked.tenant_id, space_id=locked.space_id, source=locked,
            kind=RunKind.CRAWL_PREVIEW, trigger=trigger,
        )  # fmt: skip
        dispatch.QUEUE.dispatch_on_commit(run.id)
    return run


def list_into(run: SourceRun, task_id: str, datasources) -> None:
    """The preview's provider read: crawl once, record each page (no content), fenced."""
    if run.source is None:  # start_preview always names the website source
        raise ValueError(f"crawl preview run {run.id} has no source to crawl")
    pages = crawled_pages(run.source, datasources)
    rows: list[SourceRunItem] = []
    seen: set[str] = set()
    for page in pages:
        key = digest(page["source_url"])
        if key in seen:
            continue
        seen.add(key)
        content = page.get("content")
        data = content.encode() if isinstance(content, str) else b""
        rows.append(
            SourceRunItem(
                run=run, ordinal=len(rows), provider_item_id=page["source_url"],
                item_digest=key, state=RunItemState.LISTED,
                payload={
                    "source_url": page["source_url"][:2048],
                    "title": page["title"][:512],
                    "sha256": hashlib.sha256(data).hexdigest() if data else None,
                    "size": len(data),
                },
            )
        )  # fmt: skip
    with transaction.atomic():
        now = timezone.now()
        if not dispatch.QUEUE.held(run.id, task_id).update(
            checkpoint=Checkpoint.PROVIDER_READ, step_started_at=now, updated_at=now,
            progress_total=len(rows), progress_completed=len(rows),
        ):  # fmt: skip
            raise dispatch.ClaimLost(str(run.id))
        SourceRunItem.objects.filter(run=run).delete()  # a retried preview lists anew
        SourceRunItem.objects.bulk_create(rows, batch_size=500)


def _limit(raw) -> int:
    if raw is None:
        return 50
    if not (str(raw).isascii() and str(raw).isdigit()) or not 1 <= int(raw) <= MAX_PAGE_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PAGE_LIMIT}",
                           code="invalid_limit", details={"field": "limit"})  # fmt: skip
    return int(raw)


def pages_of(run: SourceRun, *, cursor: str | None, limit) -> dict:
    """One page of a preview's listed pages: ``{pages, total, next_cursor}`` (by ordinal)."""
    size = _limit(limit)
    start = 0
    if cursor:
        if not (cursor.isascii() and cursor.isdigit()):
            raise InvalidInput("cursor is not one this listing gave", code="invalid_cursor",
                               details={"field": "cursor"})  # fmt: skip
        start = int(cursor)
    listed = SourceRunItem.objects.filter(run=run, state=RunItemState.LISTED)
    rows = list(listed.filter(ordinal__gte=start).order_by("ordinal")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return {
        "pages": [
            {k: r.payload.get(k) for k in ("source_url", "title", "sha256", "size")} for r in rows
        ],
        "total": listed.count(),
        "next_cursor": str(rows[-1].ordinal + 1) if more else None,
    }


def check_selection(source: Source, body) -> tuple[SourceRun, list[str]]:
    """The preview run and the selected URLs of ``{preview_run_id, urls}`` (400 naming the
    field, the limit or the URLs the preview never listed)."""
    _website(source)
    if not isinstance(body, dict) or set(body) - {"preview_run_id", "urls"}:
        raise InvalidInput(
            "a website import is {preview_run_id, urls: [...]}: run POST …/crawl-preview first, "
            "then select from its pages",
            code="crawl_preview_required",
            details={"field": "preview_run_id"},
        )
    try:
        run_id = uuid.UUID(str(body.get("preview_run_id")))
    except ValueError:
        raise InvalidInput("preview_run_id is not a run id", code="crawl_preview_required",
                           details={"field": "preview_run_id"}) from None  # fmt: skip
    preview = SourceRun.objects.filter(id=run_id, source=source).first()
    if preview is None or preview.kind != RunKind.CRAWL_PREVIEW:
        raise NotFound("crawl preview run not found for this source",
                       code="source_run_not_found")  # fmt: skip
    if preview.state != RunState.COMPLETED:
        raise Conflict(
            f"the crawl preview is {preview.state}; select once it has completed",
            code="source_preview_not_completed",
        )
    urls = body.get("urls")
    if not isinstance(urls, list) or not 1 <= len(urls) <= MAX_ITEMS:
        raise InvalidInput(
            f"urls must list 1 to {MAX_ITEMS} URLs of the preview"
            + (f" ({len(urls)} given)" if isinstance(urls, list) else ""),
            code="too_many_items" if isinstance(urls, list) and urls else "invalid_items",
            details={"field": "urls", "max": MAX_ITEMS},
        )
    for n, value in enumerate(urls):
        if not isinstance(value, str) or not value.strip() or len(value) > 2048:
            raise InvalidInput(f"urls[{n}] must be a URL of at most 2048 characters",
                               code="invalid_items", details={"field": f"urls[{n}]"})  # fmt: skip
    chosen = list(dict.fromkeys(u.strip() for u in urls))
    listed = set(
        SourceRunItem.objects.filter(
            run=preview, state=RunItemState.LISTED, item_digest__in=[digest(u) for u in chosen]
        ).values_list("provider_item_id", flat=True)
    )
    unknown = [u for u in chosen if u not in listed]
    if unknown:
        named = ", ".join(unknown[:NAMED_IN_MESSAGE])
        extra = len(unknown) - NAMED_IN_MESSAGE
        more = f" and {extra} more" if extra > 0 else ""
        raise InvalidInput(
            f"not in crawl preview {preview.id}: {named}{more}",
            code="source_selection_not_in_preview",
            details={"field": "urls", "urls": unknown},
        )
    for n, value in enumerate(chosen):
        check_public_url(value, f"urls[{n}]")
    return preview, chosen


def start_crawl_import(source: Source, body, *, trigger: str = "api") -> SourceRun:
    """Queue a ``crawl-import`` of the selection ``body`` froze from a completed preview."""
    preview, urls = check_selection(source, body)
    frozen = {
        r.provider_item_id: r.payload
        for r in SourceRunItem.objects.filter(run=preview, provider_item_id__in=urls)
    }
    with transaction.atomic():
        locked = lock_idle(source)
        run = SourceRun.objects.create(
            tenant_id=locked.tenant_id, space_id=locked.space_id, source=locked,
            kind=RunKind.CRAWL_IMPORT, trigger=trigger, progress_total=len(urls),
        )  # fmt: skip
        SourceRunItem.objects.bulk_create(
            SourceRunItem(
                run=run,
                ordinal=n,
                provider_item_id=url,
                item_digest=digest(url),
                payload={
                    "source_url": url,
                    "title": frozen[url].get("title") or "",
                    "preview_run_id": str(preview.id),
                    "preview_sha256": frozen[url].get("sha256"),
                },
            )  # fmt: skip
            for n, url in enumerate(urls)
        )
        dispatch.QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run
