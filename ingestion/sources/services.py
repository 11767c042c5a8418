"""Sources of a space: create, list, read, delete, and the credential test through Dify.

A source names a Dify datasource connection by ``credential_id`` only; its ``parameters`` go to
the plugin as they are and must never carry a credential (a member named like ``token``,
``secret``, ``password``, ``api_key``, ``credential``, ``authorization`` or ``client_id``,
at any depth, is 400 ``credential_in_parameters``). Dify refusing the connection to this
tenant (403: the credential belongs to another workspace or account) is 403
``source_credential_forbidden``; no inner datasource API configured is 503
``datasources_unavailable`` (codes: docs/api.md).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from knowledgefs.dify.datasources import DifyDatasources, refuse_credentials
from knowledgefs.dify.errors import DatasourceError, DifyNotConfigured
from knowledgefs.dify.model_runtime import canonical_provider
from knowledgefs.errors import Conflict, Forbidden, InvalidInput, Unavailable
from spaces.models import KnowledgeSpace

from .models import LIVE_RUN_STATES, Source, SourceKind

logger = logging.getLogger("knowledgefs.sources")

CREATE_MEMBERS = ("name", "kind", "provider", "datasource", "credential_id", "parameters")
MAX_NAME = 200
MAX_PARAMETERS_BYTES = 16 * 1024
_CREDENTIAL_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,512}$")


def _invalid(field: str, message: str, code: str = "invalid_source") -> InvalidInput:
    return InvalidInput(f"{field}: {message}", code=code, details={"field": field})


def _string(body: dict[str, Any], field: str, limit: int) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise _invalid(field, "required, a non-empty string")
    value = value.strip()
    if len(value) > limit or any(unicodedata.category(c) in ("Cc", "Cf") for c in value):
        raise _invalid(field, f"at most {limit} characters without control characters")
    return value


def check_create(body: object) -> dict[str, Any]:
    """The checked fields of a create request ``{name, kind, provider, datasource,
    credential_id, parameters?}`` (400 naming the member otherwise)."""
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(CREATE_MEMBERS))
    if unknown:
        raise _invalid(
            unknown[0],
            f"not a source member (members: {', '.join(CREATE_MEMBERS)}); a source never holds "
            "a secret, credential_id names the connection Dify holds",
            code="credential_in_parameters"
            if re.search(r"(?i)token|secret|password|key|credential", unknown[0])
            else "invalid_source",
        )
    kind = body.get("kind")
    if kind not in SourceKind.values:
        raise _invalid("kind", f"one of {', '.join(SourceKind.values)}")
    provider = body.get("provider")
    try:
        if not isinstance(provider, str):
            raise DatasourceError.of("input", "the provider must be a string")
        provider = canonical_provider(provider, DatasourceError)
    except DatasourceError:
        raise _invalid(
            "provider", "must be '<org>/<plugin>/<provider>' (langgenius/notion_datasource/notion)",
            code="invalid_provider",
        ) from None  # fmt: skip
    credential_id = body.get("credential_id")
    if not isinstance(credential_id, str) or not _CREDENTIAL_ID.match(credential_id):
        raise _invalid(
            "credential_id",
            "the id Dify gave the connection (letters, digits, '_', '.', ':', '-'; at most 512)",
            code="invalid_credential_id",
        )
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise _invalid("parameters", "must be a JSON object")
    try:
        refuse_credentials(parameters, "parameters")
    except DatasourceError as exc:
        raise InvalidInput(
            exc.message,
            code="credential_in_parameters",
            details={"field": "parameters"},
        ) from None
    if len(json.dumps(parameters)) > MAX_PARAMETERS_BYTES:
        raise _invalid("parameters", f"at most {MAX_PARAMETERS_BYTES} bytes of JSON")
    return {
        "name": _string(body, "name", MAX_NAME),
        "kind": kind,
        "provider": provider,
        "datasource": _string(body, "datasource", 256),
        "credential_id": credential_id,
        "parameters": parameters,
    }


def _urls(value: object, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """Every string of ``value`` that looks like a URL, with where it is."""
    if isinstance(value, str):
        if "://" in value or value.lower().startswith(("localhost", "www.")):
            yield path, value
    elif isinstance(value, dict) and depth < 4:
        for key, item in value.items():
            yield from _urls(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list) and depth < 4:
        for n, item in enumerate(value):
            yield from _urls(item, f"{path}[{n}]", depth + 1)


def check_public_url(url: str, field: str) -> None:
    """A crawl target must be a public http(s) URL: another scheme, ``localhost`` or an IP
    literal that is private, loopback, link-local, reserved or multicast (cloud metadata at
    169.254.169.254, a database on 127.0.0.1) is 400 ``source_target_refused`` (BC-48). Host
    names are not resolved here: Dify's crawler fetches, under its own SSRF rules."""
    parsed = urlsplit(url.strip())
    host = (parsed.hostname or "").rstrip(".").lower()
    refused = parsed.scheme not in ("http", "https") or not host
    refused = refused or host == "localhost" or host.endswith((".localhost", ".internal"))
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and not address.is_global:
        refused = True
    if refused:
        raise InvalidInput(
            f"{field}: a crawl target must be a public http(s) URL, not {parsed.scheme}://"
            f"{host or '?'} (private, loopback, link-local and non-http targets are refused)",
            code="source_target_refused",
            details={"field": field},
        )


def create_source(space: KnowledgeSpace, body: object) -> Source:
    fields = check_create(body)
    if fields["kind"] == SourceKind.WEBSITE:
        for field, url in _urls(fields["parameters"], "parameters"):
            check_public_url(url, field)
    return Source.objects.create(tenant_id=space.tenant_id, space=space, **fields)


def sources_in(space: KnowledgeSpace) -> QuerySet[Source]:
    return Source.objects.filter(space=space).order_by("-created_at", "-id")


def get_source(space: KnowledgeSpace, source_id: object) -> Source:
    return Source.objects.get_in_space(space, source_id, what="source")


def delete_source(source: Source, *, documents: str = "keep") -> None:
    """Delete the source and its items; its documents stay (``keep``) or are deleted
    (``cascade``). 409 ``source_run_active`` while a run is live."""
    if documents not in ("keep", "cascade"):
        raise _invalid("documents", "keep or cascade")
    from ingestion.documents import purge_documents
    from ingestion.models import Document

    with transaction.atomic():
        locked = Source.objects.select_for_update().filter(id=source.id).first()
        if locked is None:
            return
        if locked.runs.filter(state__in=LIVE_RUN_STATES).exists():
            raise Conflict(
                "a run of this source is queued or running; cancel it first",
                code="source_run_active",
            )
        document_ids = list(
            locked.items.exclude(document=None).values_list("document_id", flat=True)
        )
        locked.delete()
    if documents == "cascade" and document_ids:
        purge_documents(Document.objects.filter(id__in=document_ids))


# --- Dify ----------------------------------------------------------------------------------------


def client() -> DifyDatasources:
    """The inner datasource client (503 ``datasources_unavailable`` when Dify's inner API is not
    configured: a ``local`` runtime without ``DIFY_INNER_API_URL``)."""
    try:
        return DifyDatasources()
    except DifyNotConfigured:
        raise Unavailable(
            "datasources are served through Dify's inner API, which is not configured here "
            "(DIFY_INNER_API_URL, DIFY_INNER_API_KEY)",
            code="datasources_unavailable",
        ) from None


def call_args(source: Source) -> dict[str, Any]:
    return {
        "tenant_id": source.tenant_id,
        "provider": source.provider,
        "datasource": source.datasource,
    }


def forbidden(exc: DatasourceError) -> bool:
    """Dify refused the connection to this tenant or account (403)."""
    return exc.status == 403


def credential_forbidden() -> Forbidden:
    return Forbidden(
        "Dify refused this datasource connection to this workspace (403): credential_id names "
        "a connection of another tenant or one this account may not use",
        code="source_credential_forbidden",
    )


def test_source(source: Source) -> dict[str, Any]:
    """Validate the connection through Dify: ``{valid, code?, error?}``. A connection Dify
    knows but the plugin refuses (expired, revoked) is ``valid: false`` with
    ``source_credential_invalid``; Dify's 403 is raised as 403
    ``source_credential_forbidden``; other Dify failures go through the API's Dify error
    answer (503 retryable, 502 otherwise)."""
    datasources = client()
    try:
        valid = datasources.validate_credentials(
            source.credential_id, datasource_type=source.datasource_type, **call_args(source)
        )
    except DatasourceError as exc:
        if forbidden(exc):
            raise credential_forbidden() from None
        if exc.code == DatasourceError.CODES["error"]:
            return {
                "valid": False,
                "code": "source_credential_invalid",
                "error": "Dify does not know this connection or the plugin refused it",
            }
        raise
    Source.objects.filter(id=source.id).update(updated_at=timezone.now())
    if valid:
        return {"valid": True}
    return {
        "valid": False,
        "code": "source_credential_invalid",
        "error": "the connection's credentials no longer work (expired or revoked in Dify)",
    }
