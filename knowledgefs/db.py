"""Database helpers shared by the apps' services."""

from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet


def lock_for_update(queryset: QuerySet) -> QuerySet:
    """``SELECT … FOR NO KEY UPDATE`` where the database has it, else ``FOR UPDATE``.

    Use it to serialise writers on a parent row (a document, a space). On PostgreSQL a plain
    ``FOR UPDATE`` conflicts with the ``FOR KEY SHARE`` lock that every insert of a child row
    takes on its parent when its deferred foreign key is checked at commit, so a transaction
    writing nodes under a job lock and another holding the document lock and waiting for that
    job would deadlock; ``FOR NO KEY UPDATE`` does not conflict with it. SQLite ignores row locks
    (its IMMEDIATE transactions serialise writers).
    """
    if connection.features.has_select_for_no_key_update:
        return queryset.select_for_update(no_key=True)
    return queryset.select_for_update()
