"""Datasources (Notion, Google Drive, …) through Dify's inner datasource API.

Dify owns every datasource connection: its OAuth tokens and secrets stay in Dify, and KnowledgeFS
names a connection by the ``credential_id`` Dify gave it. No function here accepts a credential
value; there is no parameter it could go in.

One route, ``POST /inner/api/invoke/datasource``, answered as a stream of length-prefixed frames,
each Dify's ``{data, error}`` envelope. A call names ``tenant_id``, ``user_id``, the provider as
``<org>/<plugin>/<provider>``, the ``datasource`` (the plugin's datasource name), its type
(``online_document``, ``online_drive``, ``website_crawl``) and an ``operation``.

Nothing is retried inline (the durable job layer decides, from ``retryable``); each call is
bounded by its timeout (60 s) and its answer by 8 MiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import config
from .envelope import unwrap_envelope
from .errors import DatasourceError
from .frames import iter_frames
from .model_runtime import canonical_provider
from .transport import DifyTransport

DATASOURCE = "/inner/api/invoke/datasource"
DATASOURCE_TYPES = ("online_document", "online_drive", "website_crawl")
_CREDENTIAL_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,512}$")


def _input_error(message: str) -> DatasourceError:
    return DatasourceError.of("input", message)  # type: ignore[return-value]


def _text(value: Any, name: str, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value.strip()) > max_length:
        raise _input_error(f"{name} must be a non-empty string of at most {max_length} characters")
    return value.strip()


_CREDENTIAL_NAMES = re.compile(
    r"(?i)(token|secret|password|passwd|api[_-]?key|credential|authorization|client[_-]?id)"
)


def refuse_credentials(value: Any, name: str, depth: int = 0) -> None:
    """Parameters go to the plugin as they are; a credential must never ride along in them."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and _CREDENTIAL_NAMES.search(key):
                raise _input_error(
                    f"{name} must not carry credentials ({key!r}); Dify holds them and "
                    "credential_id names them"
                )
            if depth < 4:
                refuse_credentials(item, name, depth + 1)
    elif isinstance(value, list | tuple) and depth < 4:
        for item in value:
            refuse_credentials(item, name, depth + 1)


class DifyDatasources:
    """Client of Dify's inner datasource API, by Dify-managed ``credential_id`` only.

    ``timeout_ms`` (60 000) bounds each call, its answer included; ``max_response_bytes``
    (8 MiB) bounds the answer. Errors are :class:`~knowledgefs.dify.errors.DatasourceError`
    (codes ``DATASOURCE_*``); an error frame from the plugin (an expired connection, an unknown
    credential id) is ``DATASOURCE_ERROR``.
    """

    def __init__(
        self,
        *,
        transport: DifyTransport | None = None,
        timeout_ms: int = config.DATASOURCE_TIMEOUT_MS,
        max_response_bytes: int = config.DATASOURCE_MAX_RESPONSE_BYTES,
        user_id: str = config.USER_ID,
    ) -> None:
        self.transport = transport or DifyTransport()
        self.timeout_ms = timeout_ms
        self.max_response_bytes = max_response_bytes
        self.user_id = _text(user_id, "user_id", 512)

    def validate_credentials(
        self,
        credential_id: str,
        *,
        tenant_id: str,
        provider: str,
        datasource: str,
        datasource_type: str,
    ) -> bool:
        """Ask Dify whether the connection ``credential_id`` still works; ``True``/``False``
        from the plugin's ``{"result": bool}``."""
        frames = self._invoke(
            credential_id, tenant_id, provider, datasource, datasource_type, "validate_credentials"
        )
        results = [frame.get("result") for frame in frames]
        if not results or not all(isinstance(result, bool) for result in results):
            raise DatasourceError.of(
                "invalid", f"{DATASOURCE}: validate_credentials did not answer a boolean result"
            )
        return bool(results[-1])

    def browse(
        self,
        credential_id: str,
        *,
        tenant_id: str,
        provider: str,
        datasource: str,
        datasource_type: str,
        prefix: str = "",
        bucket: str | None = None,
        max_keys: int = 20,
        next_page_parameters: Mapping[str, Any] | None = None,
        datasource_parameters: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Browse a connection; returns the ``data`` of every frame, in order.

        ``online_drive``: ``online_drive_browse_files`` under ``prefix`` (and ``bucket``),
        ``max_keys`` 1..1000 per page, ``next_page_parameters`` from the previous page
        (each frame holds ``{"result": [{"bucket", "files", "is_truncated",
        "next_page_parameters"}]}``). ``online_document``: ``get_online_document_pages`` with
        ``datasource_parameters`` (``{"result": [{"workspace_id", "pages", …}]}``).
        """
        if datasource_type == "online_drive":
            if isinstance(max_keys, bool) or not isinstance(max_keys, int):
                raise _input_error("max_keys must be an integer")
            if not 1 <= max_keys <= config.DATASOURCE_MAX_KEYS:
                raise _input_error(f"max_keys must be between 1 and {config.DATASOURCE_MAX_KEYS}")
            request: dict[str, Any] = {"prefix": prefix, "max_keys": max_keys}
            if bucket is not None:
                request["bucket"] = bucket
            if next_page_parameters is not None:
                request["next_page_parameters"] = dict(next_page_parameters)
            return self._invoke(
                credential_id,
                tenant_id,
                provider,
                datasource,
                datasource_type,
                "online_drive_browse_files",
                request=request,
            )
        if datasource_type == "online_document":
            return self._invoke(
                credential_id,
                tenant_id,
                provider,
                datasource,
                datasource_type,
                "get_online_document_pages",
                datasource_parameters=dict(datasource_parameters or {}),
            )
        raise _input_error(
            f"browse serves online_drive and online_document, not {datasource_type!r}"
        )

    def page_content(
        self,
        credential_id: str,
        *,
        tenant_id: str,
        provider: str,
        datasource: str,
        workspace_id: str,
        page_id: str,
        page_type: str = "page",
    ) -> dict[str, Any]:
        """``get_online_document_page_content`` of one page: the last frame's ``result``
        (``{"workspace_id", "page_id", "content", …}``)."""
        frames = self._invoke(
            credential_id,
            tenant_id,
            provider,
            datasource,
            "online_document",
            "get_online_document_page_content",
            page={
                "page_id": _text(page_id, "page_id", 1024),
                "type": _text(page_type, "type", 64),
                "workspace_id": _text(workspace_id, "workspace_id", 1024),
            },
        )
        return _last_result(frames, "get_online_document_page_content")

    def download(
        self,
        credential_id: str,
        *,
        tenant_id: str,
        provider: str,
        datasource: str,
        file_id: str,
        bucket: str | None = None,
    ) -> dict[str, Any]:
        """``online_drive_download_file``: the last frame's ``result`` (``{"file_name",
        "mime_type", "content_base64"}``), bounded by ``max_response_bytes`` like any answer."""
        request: dict[str, Any] = {"id": _text(file_id, "id", 1024)}
        if bucket:
            request["bucket"] = bucket
        frames = self._invoke(
            credential_id,
            tenant_id,
            provider,
            datasource,
            "online_drive",
            "online_drive_download_file",
            request=request,
        )
        return _last_result(frames, "online_drive_download_file")

    def crawl(
        self,
        credential_id: str,
        *,
        tenant_id: str,
        provider: str,
        datasource: str,
        datasource_parameters: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """``get_website_crawl``: the pages of the last frame (``{"result": {"status",
        "web_info_list": [{"source_url", "title", "content", …}]}}``)."""
        frames = self._invoke(
            credential_id,
            tenant_id,
            provider,
            datasource,
            "website_crawl",
            "get_website_crawl",
            datasource_parameters=dict(datasource_parameters or {}),
        )
        result = _last_result(frames, "get_website_crawl")
        pages = result.get("web_info_list")
        if not isinstance(pages, list) or not all(isinstance(p, dict) for p in pages):
            raise DatasourceError.of(
                "invalid", f"{DATASOURCE}: get_website_crawl answered no web_info_list"
            )
        return pages

    def _invoke(
        self,
        credential_id: str,
        tenant_id: str,
        provider: str,
        datasource: str,
        datasource_type: str,
        operation: str,
        **fields: Any,
    ) -> list[dict[str, Any]]:
        if not isinstance(credential_id, str) or not _CREDENTIAL_ID.match(credential_id):
            raise _input_error(
                "credential_id must be the id Dify gave the connection (letters, digits, "
                "'_', '.', ':', '-'; at most 512)"
            )
        if datasource_type not in DATASOURCE_TYPES:
            raise _input_error(f"datasource_type must be one of {DATASOURCE_TYPES}")
        provider = canonical_provider(provider, DatasourceError)
        for name in ("request", "datasource_parameters"):
            refuse_credentials(fields.get(name), name)
        payload = {
            "tenant_id": _text(tenant_id, "tenant_id", 512),
            "user_id": self.user_id,
            "provider": provider,
            "datasource": _text(datasource, "datasource", 256),
            "datasource_type": datasource_type,
            "operation": operation,
            "credential_id": credential_id,
            **fields,
        }
        stream = self.transport.open_stream(
            "POST",
            DATASOURCE,
            errors=DatasourceError,
            timeout=self.timeout_ms / 1000,
            max_bytes=self.max_response_bytes,
            retry_until_body=False,
            json_body=payload,
            headers={"Accept": "text/event-stream"},
        )
        frames: list[dict[str, Any]] = []
        for value in iter_frames(stream, errors=DatasourceError, route=DATASOURCE):
            data = unwrap_envelope(
                value, errors=DatasourceError, route=DATASOURCE, secrets=self.transport.secrets
            )
            if not isinstance(data, dict):
                raise DatasourceError.of(
                    "invalid", f"{DATASOURCE}: a frame's data is not an object"
                )
            frames.append(data)
        return frames


def _last_result(frames: list[dict[str, Any]], operation: str) -> dict[str, Any]:
    results = [frame.get("result") for frame in frames]
    if not results or not isinstance(results[-1], dict):
        raise DatasourceError.of(
            "invalid", f"{DATASOURCE}: {operation} did not answer a result object"
        )
    return results[-1]
