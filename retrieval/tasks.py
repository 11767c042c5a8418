"""django-q2 task entry points of the retrieval app: they take ids and call the services."""

from __future__ import annotations

from retrieval import index_builds


def rebuild_index(version_id: str) -> str:
    """Fill a building index version and cut over to it (safe to deliver twice); returns its
    resulting state."""
    return index_builds.rebuild_index_version(version_id)
