"""The simulated Dify's datasource provider: a small workspace of online-document pages, drive
files and website pages behind credential ids, which a test changes or deletes between syncs.

Served by ``DifyTestServer`` on ``/inner/api/invoke/datasource`` for the credentials listed in
:attr:`FakeProvider.credentials` (``{credential_id: owning tenant or None for any}``):

- ``validate_credentials`` → ``{"result": valid}`` (:attr:`FakeProvider.valid`);
- ``get_online_document_pages`` → one workspace with every page (id, name, type,
  ``last_edited_time``);
- ``get_online_document_page_content`` → ``{"result": {"workspace_id", "page_id", "content"}}``;
- ``online_drive_browse_files`` → ``max_keys`` files per page with ``next_page_parameters``
  (``{"offset"}``), each ``{id, name, size, type, etag, checksum{sha256}}``;
- ``online_drive_download_file`` → ``{"result": {"file_name", "mime_type", "content_base64"}}``;
- ``get_website_crawl`` → ``{"result": {"status": "completed", "web_info_list": [...]}}``.

Another tenant's credential is refused as Dify refuses it: HTTP 403. An item listed in
:attr:`FakeProvider.oversize` answers more than 8 MiB. Every call is counted per operation
(:attr:`FakeProvider.calls`) and per (operation, item) (:attr:`FakeProvider.item_calls`).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

WORKSPACE = "ws-kfs"


@dataclass
class Item:
    name: str
    content: bytes
    version: int = 1
    mime_type: str = "text/markdown"

    def etag(self) -> str:
        return f'"v{self.version}"'

    def edited(self) -> str:
        return f"2026-12-01T00:{self.version:02d}:00Z"


@dataclass
class FakeProvider:
    """Pages (online documents), files (drive) and sites (website crawl) by id."""

    credentials: dict[str, str | None] = field(default_factory=dict)
    valid: bool = True
    pages: dict[str, Item] = field(default_factory=dict)
    files: dict[str, Item] = field(default_factory=dict)
    sites: dict[str, Item] = field(default_factory=dict)
    oversize: set[str] = field(default_factory=set)
    send_checksums: bool = True
    calls: Counter[str | None] = field(default_factory=Counter)
    item_calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def change(self, kind: str, item_id: str, content: bytes) -> None:
        """New content for an item: its version moves on (etag, edited time)."""
        item = getattr(self, kind)[item_id]
        item.content = content
        item.version += 1

    def serves(self, credential: str | None) -> bool:
        return credential in self.credentials

    def answer(self, body: dict[str, Any]) -> tuple[int, list[Any]]:
        """``(HTTP status, [frame data])`` for one request."""
        owner = self.credentials[body["credential_id"]]
        operation = body.get("operation")
        with self.lock:
            self.calls[operation] += 1
        if owner is not None and body.get("tenant_id") != owner:
            return 403, [{"code": "forbidden", "message": "credential not visible"}]
        if operation == "validate_credentials":
            return 200, [{"result": self.valid}]
        if not self.valid:
            return 200, [None, "credential expired"]
        handler = getattr(self, "_" + str(operation), None)
        if handler is None:
            return 200, [None, f"operation {operation} not served"]
        return 200, handler(body)

    def _count(self, operation: str, item_id: str) -> None:
        with self.lock:
            self.item_calls[(operation, item_id)] += 1

    def _body(self, item_id: str, item: Item) -> bytes:
        return b"x" * (9 * 1024 * 1024) if item_id in self.oversize else item.content

    def _get_online_document_pages(self, body: dict[str, Any]) -> list[Any]:
        pages = [
            {"page_id": pid, "page_name": p.name, "type": "page", "parent_id": None,
             "last_edited_time": p.edited()}
            for pid, p in sorted(self.pages.items())
        ]  # fmt: skip
        workspace = {"workspace_id": WORKSPACE, "workspace_name": "KFS", "total": len(pages)}
        return [{"result": [{**workspace, "pages": pages}]}]

    def _get_online_document_page_content(self, body: dict[str, Any]) -> list[Any]:
        page_id = body["page"]["page_id"]
        self._count("get_online_document_page_content", page_id)
        item = self.pages.get(page_id)
        if item is None:
            return [None, f"page {page_id} not found"]
        content = self._body(page_id, item).decode()
        return [{"result": {"workspace_id": WORKSPACE, "page_id": page_id, "content": content}}]

    def _online_drive_browse_files(self, body: dict[str, Any]) -> list[Any]:
        request = body["request"]
        start = int((request.get("next_page_parameters") or {}).get("offset", 0))
        ids = sorted(i for i, f in self.files.items() if f.name.startswith(request["prefix"]))
        chunk = ids[start : start + request["max_keys"]]
        more = start + len(chunk) < len(ids)
        files = []
        for file_id in chunk:
            item = self.files[file_id]
            entry = {"id": file_id, "name": item.name, "size": len(item.content),
                     "type": "file", "etag": item.etag()}  # fmt: skip
            if self.send_checksums:
                entry["checksum"] = {"sha256": hashlib.sha256(item.content).hexdigest()}
            files.append(entry)
        result = {
            "bucket": request.get("bucket") or "",
            "files": files,
            "is_truncated": more,
            "next_page_parameters": {"offset": start + len(chunk)} if more else None,
        }
        return [{"result": [result]}]

    def _online_drive_download_file(self, body: dict[str, Any]) -> list[Any]:
        file_id = body["request"]["id"]
        self._count("online_drive_download_file", file_id)
        item = self.files.get(file_id)
        if item is None:
            return [None, f"file {file_id} not found"]
        data = base64.b64encode(self._body(file_id, item)).decode()
        result = {"file_name": item.name, "mime_type": item.mime_type, "content_base64": data}
        return [{"result": result}]

    def _get_website_crawl(self, body: dict[str, Any]) -> list[Any]:
        pages = []
        for url, item in sorted(self.sites.items()):
            self._count("get_website_crawl", url)
            pages.append({"source_url": url, "title": item.name, "description": "",
                          "content": self._body(url, item).decode()})  # fmt: skip
        return [{"result": {"status": "completed", "web_info_list": pages}}]
