"""Search backends behind one interface.

``KNOWLEDGE_SEARCH_BACKEND=database`` (the default): the database vendor picks the
implementation (per-space tantivy indexes on SQLite, tsvector on PostgreSQL). ``dify``: the
Dify vector and text bridge (:mod:`.dify`), whatever the vendor among the supported ones.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from .base import (
    IndexedNode,
    ScoredNode,
    SearchBackend,
    SearchBackendError,
    SearchBackendUnavailable,
)

__all__ = [
    "SUPPORTED_VENDORS",
    "IndexedNode",
    "ScoredNode",
    "SearchBackend",
    "SearchBackendError",
    "SearchBackendUnavailable",
    "backend_name",
    "get_search_backend",
    "require_supported_engine",
    "unsupported_reason",
]

#: Database vendors (Django's ``connection.vendor``) that have a search backend.
SUPPORTED_VENDORS = ("sqlite", "postgresql")

_backends: dict[str, SearchBackend] = {}


def unsupported_reason(vendor: str) -> str | None:
    """``None`` when ``vendor`` has a search backend, else the operator-facing reason (one
    line naming the engine; used by queries, indexing and the ``search`` readiness check)."""
    if vendor in SUPPORTED_VENDORS:
        return None
    engine = "MySQL/MariaDB" if vendor == "mysql" else repr(vendor)
    return (
        f"no search backend for the database engine {engine} (vendor {vendor!r}): "
        "MySQL/MariaDB is supported for the schema, migrations and downgrades only; "
        "retrieval and indexing need SQLite or PostgreSQL"
    )


def require_supported_engine() -> None:
    """503 ``search_backend_unavailable`` (details ``{"vendor"}``) on a database engine without
    a search backend (MySQL/MariaDB), checked before anything is written: an upload or an
    ingest there would store a document that can never compile."""
    vendor = connection.vendor
    reason = unsupported_reason(vendor)
    if reason is not None:
        raise SearchBackendUnavailable(reason, details={"vendor": vendor})


def backend_name() -> str:
    """``settings.KNOWLEDGE_SEARCH_BACKEND``: ``database`` (default) or ``dify``."""
    return getattr(settings, "KNOWLEDGE_SEARCH_BACKEND", "database")


def get_search_backend() -> SearchBackend:
    """The search backend: with ``KNOWLEDGE_SEARCH_BACKEND=dify`` the Dify bridge
    (:class:`.dify.DifyBridgeBackend`); otherwise the default database's: ``sqlite`` → tantivy,
    ``postgresql`` → tsvector and pgvector.

    Raises :class:`SearchBackendUnavailable` (503 ``search_backend_unavailable``, details
    ``{"vendor"}``) on any other engine (MySQL/MariaDB), and on PostgreSQL without pgvector ≥ 0.8
    set up (details ``{"vendor", "extension": "vector"}``, the message names what is missing),
    so a query there is never a 500.
    """
    vendor = connection.vendor
    if backend_name() == "dify":
        reason = unsupported_reason(vendor)
        if reason is not None:
            raise SearchBackendUnavailable(reason, details={"vendor": vendor})
        if "dify" not in _backends:
            from .dify import DifyBridgeBackend

            _backends["dify"] = DifyBridgeBackend()
        return _backends["dify"]
    if vendor not in _backends:
        reason = unsupported_reason(vendor)
        if reason is not None:
            raise SearchBackendUnavailable(reason, details={"vendor": vendor})
        if vendor == "sqlite":
            from .sqlite import SQLiteSearchBackend

            _backends[vendor] = SQLiteSearchBackend()
        else:
            from .pgvector import extension_problem
            from .postgres import PostgresSearchBackend

            problem = extension_problem(connection)
            if problem is not None:  # checked until it holds, then once per process
                raise SearchBackendUnavailable(
                    problem, details={"vendor": vendor, "extension": "vector"}
                )
            _backends[vendor] = PostgresSearchBackend()
    return _backends[vendor]
