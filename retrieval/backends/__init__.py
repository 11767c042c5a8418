"""Search backends behind one interface; the database vendor picks the implementation."""

from __future__ import annotations

from django.db import connection

from .base import IndexedNode, ScoredNode, SearchBackend

__all__ = ["IndexedNode", "ScoredNode", "SearchBackend", "get_search_backend"]

_backends: dict[str, SearchBackend] = {}


def get_search_backend() -> SearchBackend:
    """The backend for the default database: ``sqlite`` → FTS5, ``postgresql`` → tsvector."""
    vendor = connection.vendor
    if vendor not in _backends:
        if vendor == "sqlite":
            from .sqlite import SQLiteSearchBackend

            _backends[vendor] = SQLiteSearchBackend()
        elif vendor == "postgresql":
            from .postgres import PostgresSearchBackend

            _backends[vendor] = PostgresSearchBackend()
        else:
            raise RuntimeError(f"no search backend for database vendor {vendor!r}")
    return _backends[vendor]
