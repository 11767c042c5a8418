"""Reading a source's listing through Dify: the pages of online documents and crawled websites
(``GET …/pages``, a cursor, at most 200 a page), drive listings (``GET …/files``, at most 1,000
keys, a continuation token), and the whole listing a sync compares against
(:func:`provider_listing`)."""

from __future__ import annotations

import base64
import binascii
import json

from knowledgefs.dify.errors import DatasourceError
from knowledgefs.errors import InvalidInput

from .models import Source, SourceKind
from .services import call_args, client, credential_forbidden, forbidden

MAX_PAGE_LIMIT = 200
MAX_KEYS = 1000
#: A sync reads at most this many drive listing pages (of 1,000 keys) before it stops.
MAX_DRIVE_PAGES = 200


def crawled_pages(source: Source, datasources) -> list[dict]:
    """A website crawl through Dify, in the provider's order:
    ``{source_url, title, description, content}``."""
    crawled = datasources.crawl(
        source.credential_id, datasource_parameters=source.parameters, **call_args(source)
    )
    return [
        {
            "source_url": str(p.get("source_url") or ""),
            "title": str(p.get("title") or ""),
            "description": str(p.get("description") or ""),
            "content": p.get("content"),
        }
        for p in crawled
        if p.get("source_url")
    ]


def _pages(source: Source, datasources) -> list[dict]:
    """Every page of an online-document source or crawled website, in the provider's order:
    ``{page_id, name, type, workspace_id, workspace_name, last_edited_time}`` or
    ``{source_url, title, description, content}``."""
    args = call_args(source)
    if source.kind == SourceKind.WEBSITE:
        return crawled_pages(source, datasources)
    frames = datasources.browse(
        source.credential_id, datasource_type="online_document",
        datasource_parameters=source.parameters, **args,
    )  # fmt: skip
    pages = []
    for frame in frames:
        for workspace in frame.get("result") or []:
            for page in workspace.get("pages") or []:
                pages.append(
                    {
                        "workspace_id": str(workspace.get("workspace_id") or ""),
                        "workspace_name": workspace.get("workspace_name"),
                        "page_id": str(page.get("page_id") or ""),
                        "name": str(page.get("page_name") or ""),
                        "type": str(page.get("type") or "page"),
                        "parent_id": page.get("parent_id"),
                        "last_edited_time": str(page.get("last_edited_time") or ""),
                    }
                )
    return pages


def _guard(call):
    try:
        return call()
    except DatasourceError as exc:
        if forbidden(exc):
            raise credential_forbidden() from None
        raise


def _limit(raw, name: str, default: int, maximum: int) -> int:
    if raw is None:
        return default
    if not (str(raw).isascii() and str(raw).isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidInput(f"{name} must be an integer from 1 to {maximum}", code="invalid_limit",
                           details={"field": name})  # fmt: skip
    return int(raw)


def list_pages(source: Source, *, cursor: str | None, limit) -> dict:
    """``GET …/pages``: online documents grouped by workspace; ``next_cursor`` continues.
    400 ``source_kind_mismatch`` for a drive (``GET …/files``) or a website (a durable
    ``POST …/crawl-preview``, :mod:`.preview`)."""
    if source.kind == SourceKind.ONLINE_DRIVE:
        raise InvalidInput("a drive is listed by GET …/files", code="source_kind_mismatch")
    if source.kind == SourceKind.WEBSITE:
        raise InvalidInput(
            "a website is listed by a crawl preview run: POST …/crawl-preview",
            code="source_kind_mismatch",
        )
    size = _limit(limit, "limit", 50, MAX_PAGE_LIMIT)
    start = 0
    if cursor:
        if not (cursor.isascii() and cursor.isdigit()):
            raise InvalidInput("cursor is not one this listing gave", code="invalid_cursor")
        start = int(cursor)
    pages = _guard(lambda: _pages(source, client()))
    window = pages[start : start + size]
    following = str(start + size) if start + size < len(pages) else None
    workspaces: dict[str, dict] = {}
    for page in window:
        group = workspaces.setdefault(
            page["workspace_id"],
            {"workspace_id": page["workspace_id"], "workspace_name": page["workspace_name"],
             "pages": []},
        )  # fmt: skip
        group["pages"].append(
            {k: page[k] for k in ("page_id", "name", "type", "parent_id", "last_edited_time")}
        )
    return {"workspaces": list(workspaces.values()), "total": len(pages), "next_cursor": following}


def _token(raw: str | None):
    if not raw:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise InvalidInput(
            "continuation_token is not one this listing gave",
            code="invalid_cursor",
            details={"field": "continuation_token"},
        )
    return value


def list_files(source: Source, *, bucket, prefix, max_keys, continuation_token) -> dict:
    """``GET …/files``: one page of a drive listing (at most ``max_keys`` ≤ 1,000 files) and
    the ``continuation_token`` of the next. 400 ``source_kind_mismatch`` for other kinds."""
    if source.kind != SourceKind.ONLINE_DRIVE:
        raise InvalidInput("only a drive is listed by GET …/files", code="source_kind_mismatch")
    keys = _limit(max_keys, "max_keys", 100, MAX_KEYS)
    parameters = _token(continuation_token)
    frames = _guard(
        lambda: client().browse(
            source.credential_id, datasource_type="online_drive", prefix=prefix or "",
            bucket=bucket or None, max_keys=keys, next_page_parameters=parameters,
            **call_args(source),
        )
    )  # fmt: skip
    buckets = []
    for frame in frames:
        for result in frame.get("result") or []:
            following = result.get("next_page_parameters")
            token = (
                base64.urlsafe_b64encode(json.dumps(following).encode()).decode()
                if result.get("is_truncated") and isinstance(following, dict)
                else None
            )
            buckets.append(
                {
                    "bucket": result.get("bucket") or None,
                    "files": [
                        {k: f.get(k) for k in ("id", "name", "type", "size")}
                        for f in result.get("files") or []
                    ],
                    "is_truncated": bool(result.get("is_truncated")),
                    "continuation_token": token,
                }
            )
    return {"buckets": buckets}


def provider_listing(source: Source, datasources) -> dict[str, dict]:
    """Everything the provider lists now, by provider item id (see
    :func:`ingestion.sources.runs.provider_item_id`), with what change detection compares."""
    from .runs import provider_item_id

    if source.kind != SourceKind.ONLINE_DRIVE:
        return {provider_item_id(source.kind, p): p for p in _pages(source, datasources)}
    listing: dict[str, dict] = {}
    parameters = None
    for _ in range(MAX_DRIVE_PAGES):
        frames = datasources.browse(
            source.credential_id, datasource_type="online_drive", prefix="", max_keys=MAX_KEYS,
            next_page_parameters=parameters, **call_args(source),
        )  # fmt: skip
        truncated = False
        for frame in frames:
            for result in frame.get("result") or []:
                for entry in result.get("files") or []:
                    if entry.get("type", "file") != "file" or not entry.get("id"):
                        continue
                    item = {"id": str(entry["id"]), "name": str(entry.get("name") or ""),
                            "bucket": result.get("bucket") or "",
                            "etag": str(entry.get("etag") or "")[:1024],
                            "checksum": entry.get("checksum") or {}}  # fmt: skip
                    listing[provider_item_id(source.kind, item)] = item
                if result.get("is_truncated"):
                    truncated = True
                    parameters = result.get("next_page_parameters")
        if not truncated:
            break
    return listing
