"""Pieces shared by the claim-before-enqueue dispatchers (upgrade jobs, research tasks).

Both dispatchers claim a row with a fresh task id before publishing its message, start a delivery
only by compare-and-set on that id, and run a recovery sweep every minute that takes back claims
never delivered and runs that went stale (upgrades/services/dispatch.py,
retrieval/research_tasks/dispatch.py). This module holds what their sweeps share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db import connection
from django.db.models import QuerySet


@dataclass
class SweepReport:
    """What one recovery sweep did, in rows: claims cleared because their message was never
    delivered, stale runs put back to ``queued``, rows failed ``attempts_exhausted``, and rows
    dispatched under a fresh claim."""

    undelivered_reclaimed: int = 0
    stale_requeued: int = 0
    attempts_exhausted: int = 0
    dispatched: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def locked_batch(queryset: QuerySet, batch: int) -> list:
    """Up to ``batch`` rows of ``queryset``, least recently updated first, locked ``FOR UPDATE
    SKIP LOCKED`` where the database has it (PostgreSQL, MySQL 8, MariaDB 10.6), else ``FOR
    UPDATE`` (SQLite ignores row locks; its write transactions serialise), so concurrent sweeps
    never act on one row twice. Call it inside a transaction."""
    if connection.features.has_select_for_update_skip_locked:
        queryset = queryset.select_for_update(skip_locked=True)
    else:
        queryset = queryset.select_for_update()
    return list(queryset.order_by("updated_at")[:batch])
