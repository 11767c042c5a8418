"""The registry of the django-q2 schedules the apps own, and their repair.

Each app defines its :class:`Schedule` beside the task it runs and registers it from its
``AppConfig.ready()``; :func:`ensure` creates or repairs one row of ``django_q.Schedule`` by name
(``update_or_create``: the same row whatever its state, never a second one), :func:`ensure_all`
every registered one. The migrations that first create these rows
(``knowledgefs.migration_ops.every_minute_schedule``) keep their own literal names and paths: a
migration never reads this registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class Schedule:
    """A repeating django-q2 schedule: ``func`` (a dotted task path) every ``minutes``, or every
    ``seconds_setting`` seconds rounded up to whole minutes (at least 1; the unit of django-q2
    schedules) when that setting is named. ``repeats=-1`` repeats for ever."""

    name: str
    func: str
    minutes: int = 1
    seconds_setting: str | None = None
    repeats: int = -1

    def interval_minutes(self) -> int:
        """The interval in whole minutes, reading ``seconds_setting`` now when it is named."""
        if self.seconds_setting is None:
            return self.minutes
        seconds: float = getattr(settings, self.seconds_setting)
        return max(1, math.ceil(seconds / 60))


SCHEDULES: dict[str, Schedule] = {}
"""The registered schedules by name, in registration order."""


def register(schedule: Schedule) -> Schedule:
    """Register ``schedule`` (again: replaces the entry of that name); returns it."""
    SCHEDULES[schedule.name] = schedule
    return schedule


def ensure(name: str) -> Any:  # a django_q Schedule row (django-q2 has no type information)
    """Create or repair the ``django_q.Schedule`` row of the registered schedule ``name``;
    returns the row. Raises ``KeyError`` for a name nobody registered."""
    from django_q.models import Schedule as ScheduleRow

    schedule = SCHEDULES[name]
    row, _ = ScheduleRow.objects.update_or_create(
        name=schedule.name,
        defaults={
            "func": schedule.func,
            "schedule_type": ScheduleRow.MINUTES,
            "minutes": schedule.interval_minutes(),
            "repeats": schedule.repeats,
        },
    )
    return row


def ensure_all() -> list[Any]:
    """:func:`ensure` every registered schedule, in registration order; returns the rows."""
    return [ensure(name) for name in list(SCHEDULES)]
