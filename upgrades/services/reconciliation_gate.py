"""The retrieval gate of reconciliation: a space that is the target of an unreconciled upgrade
serves no retrieval.

Retrieval on a space is refused (409 ``space_reconciliation_pending``) while any upgrade job whose
target is that space has no ``reconcile_completed_at``: before success nothing is reconciled yet,
and after it until every owed document is applied (:func:`require_reconciled`).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, models

from knowledgefs.errors import Conflict
from spaces.models import KnowledgeSpace
from upgrades.models import JobStatus, UpgradeJob
from upgrades.services.reconciliation_ledger import dead_lettered_documents, owed_documents


class ReconciliationPending(Conflict):
    """409 ``space_reconciliation_pending``: the space is the target of an upgrade whose documents'
    availability and metadata are not all applied yet; ``details`` carries ``job_id``,
    ``job_status``, ``owed_documents`` and ``dead_lettered_documents``."""

    code = "space_reconciliation_pending"


# --- retrieval gate -----------------------------------------------------------------------------
def servable_gate(space: KnowledgeSpace) -> None:
    """:func:`require_reconciled` as the servability gate of :mod:`spaces.readiness`."""
    require_reconciled(space.id)


def require_reconciled(space_id: uuid.UUID) -> None:
    """Refuse retrieval on a space whose upgrade is not reconciled: 409
    ``space_reconciliation_pending`` naming the job, its status and how many documents are owed
    or dead-lettered. One indexed query (``upgrade_job.space_id``) when the space is not an
    unfinished upgrade target, which is every space but a few; plain SQL, for every retrieval
    runs it.
    """
    row = _unreconciled_job(space_id)
    if row is None:
        return
    job_id, status = row
    owed = owed_documents(job_id).count()
    dead = dead_lettered_documents(job_id).count()
    if status != JobStatus.SUCCEEDED:
        why = f"its upgrade (job {job_id}) is {status}; documents are reconciled once it succeeds"
    elif dead:
        why = (
            f"{dead} documents of upgrade job {job_id} are dead-lettered after repeated failures "
            f"and {owed} more are owed; an operator must re-arm them (admin action 're-arm "
            "dead-lettered reconciliation')"
        )
    else:
        why = (
            f"{owed} documents of upgrade job {job_id} still owe their availability and metadata; "
            "retrieval opens once they are applied"
        )
    raise ReconciliationPending(
        f"retrieval on this space is paused: {why}",
        details={
            "job_id": str(job_id),
            "job_status": status,
            "owed_documents": owed,
            "dead_lettered_documents": dead,
        },
    )


def _field(name: str) -> models.Field[Any, Any]:
    """A concrete field of :class:`UpgradeJob` (never a reverse relation)."""
    field = UpgradeJob._meta.get_field(name)
    assert isinstance(field, models.Field)  # the names below are the model's own columns
    return field


def _column(name: str) -> str:
    """The quoted database column of an :class:`UpgradeJob` field."""
    column = _field(name).column
    assert column is not None  # only a many-to-many field has no column; the model has none
    return connection.ops.quote_name(column)


def _unreconciled_job(space_id: uuid.UUID) -> tuple[uuid.UUID, str] | None:
    """``(job id, status)`` of an upgrade job of the space without ``reconcile_completed_at``
    (the first by id), else ``None``."""
    table = UpgradeJob._meta.db_table
    key = _field("space").get_db_prep_value(space_id, connection)
    sql = (
        f"SELECT {_column('id')}, {_column('status')} FROM "
        f"{connection.ops.quote_name(table)} "
        f"WHERE {_column('space')} = %s AND {_column('reconcile_completed_at')} IS NULL "
        f"ORDER BY {_column('id')} LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [key])
        row = cursor.fetchone()
    if row is None:
        return None
    return _field("id").to_python(row[0]), row[1]
