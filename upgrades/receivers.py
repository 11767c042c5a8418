"""Upgrades receives the spaces app's signals (connected in ``UpgradesConfig.ready()``).

A space cannot be deleted while a classic Dataset upgrade into it is queued or running (it would
lose its target); a finished upgrade outlives its space and keeps its record with no space.
"""

from __future__ import annotations

from knowledgefs.errors import Conflict
from spaces.models import KnowledgeSpace

from .models import JobStatus


def refuse_while_upgrading(sender, space: KnowledgeSpace, **kwargs) -> None:
    """Refuse a space's deletion (``space_deletion_requested``) while an upgrade runs into it."""
    if space.upgrade_jobs.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists():
        raise Conflict(
            "a Dataset upgrade into this knowledge space is in progress; delete it once the "
            "upgrade has finished",
            code="space_upgrade_in_progress",
        )


def detach_finished_upgrades(sender, space: KnowledgeSpace, **kwargs) -> None:
    """Finished upgrades keep their record with no space (``space_deleting``, under its lock)."""
    space.upgrade_jobs.update(space=None)
