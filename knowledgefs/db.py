"""Database helpers shared by the apps' services."""

from __future__ import annotations

import uuid
from typing import TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

from knowledgefs.errors import NotFound

M = TypeVar("M", bound=Model)


def lock_for_update(queryset: QuerySet[M]) -> QuerySet[M]:
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


class SpaceScopedQuerySet(QuerySet[M]):
    """Rows that belong to one knowledge space (a ``space`` foreign key)."""

    def get_in_space(self, space: Model, ident: object, *, what: str) -> M:
        """The row ``ident`` of ``space``, else 404 ``<what>_not_found`` (spaces as underscores):
        also for an id that is not a UUID and for another space's row."""
        code = what.replace(" ", "_") + "_not_found"
        try:
            row_id = uuid.UUID(str(ident))
        except ValueError:
            raise NotFound(f"{what} not found", code=code) from None
        row = self.filter(id=row_id, space=space).first()
        if row is None:
            raise NotFound(f"{what} not found", code=code)
        return row
