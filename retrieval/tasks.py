"""django-q2 task entry points of the retrieval app: they take ids and call the services."""

from __future__ import annotations

from retrieval import indexing


def rebuild_index(version_id: str) -> str:
    """Fill a building index version and cut over to it (safe to deliver twice); returns its
    resulting state."""
    return indexing.rebuild_index_version(version_id)
