"""``manage.py migrate`` with the downgrade guards applied to ``--plan`` as well.

Django returns from ``migrate --plan`` before it sends ``pre_migrate``, so the guard receiver
(:func:`knowledgefs.downgrades.refuse_guarded_plan`) never sees a plan that is only printed.
This command prints the plan as Django does and then, for ``--plan APP MIGRATION``, the
refusals ``migrate`` would give (the check of ``kfs downgrade-check``), exiting with
:data:`knowledgefs.downgrades.REFUSED_EXIT_STATUS` (3) when there are any. Without ``--plan`` it
is Django's command unchanged.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections

from knowledgefs import downgrades


class Command(DjangoMigrate):
    """Django's ``migrate``; ``--plan`` also reports the downgrade refusals (module notes)."""

    def handle(self, *args: Any, **options: Any) -> str | None:
        result = super().handle(*args, **options)
        # Only a named target can be behind the applied state; a plan to the leaves is forwards.
        if options["plan"] and options.get("app_label") and options.get("migration_name"):
            check = downgrades.check_downgrade(
                connections[options["database"]], options["app_label"], options["migration_name"]
            )
            if check.refusals:
                for refusal in check.refusals:
                    self.stdout.write(f"refused: {refusal.text()}", self.style.ERROR)
                raise downgrades.DowngradeRefused(
                    f"migrate {' '.join(check.target)} would be refused "
                    f"({len(check.refusals)} refusal(s)); nothing was changed"
                )
        return result
