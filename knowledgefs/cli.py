"""``kfs downgrade-check APP MIGRATION``: the plan of a downgrade and every refusal of the guarded
downgrades (:mod:`knowledgefs.downgrades`) on the command line; changes nothing (wired into
``knowledgefs/management/commands/kfs.py``). The module contract (``COMMANDS``,
``add_parser(sub, name)``, ``handle(command, options)``) is the one of :mod:`spaces.cli`."""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from django.core.management.base import CommandError
from django.db import connections

from knowledgefs import downgrades


class Emitter(Protocol):
    """The ``kfs`` command: prints ``payload`` as JSON under ``--json``, else ``text``."""

    def emit(self, options: dict[str, Any], payload: Any, text: str) -> None: ...


COMMANDS = ("downgrade-check",)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    """Register the ``kfs`` command ``name`` (``downgrade-check``) on ``sub``."""
    check = sub.add_parser(
        name,
        help="print the plan of `migrate APP MIGRATION` and every downgrade refusal; "
        "changes nothing (exit 0 allowed, 3 refused)",
    )
    check.add_argument("app_label", metavar="APP")
    check.add_argument("migration", metavar="MIGRATION", help="a name, a unique prefix or zero")
    check.add_argument("--database", default="default")
    check.add_argument("--json", action="store_true")


def handle(command: Emitter, options: dict[str, Any]) -> None:
    """The plan and the refusals (knowledgefs.downgrades); exit status 3 when refused."""
    alias = options["database"]
    if alias not in connections:
        raise CommandError(
            f"--database {alias!r} is not configured (known: {', '.join(connections)})"
        )
    result = downgrades.check_downgrade(
        connections[alias], options["app_label"], options["migration"]
    )
    lines = [f"plan for migrate {result.target[0]} {result.target[1]}: {len(result.plan)} step(s)"]
    lines += [f"  {name}  {direction}" for name, direction in result.plan]
    lines += [f"refused: {r.text()}" for r in result.refusals]
    lines.append("allowed" if result.allowed else "refused: nothing was changed")
    command.emit(options, result.as_dict(), "\n".join(lines))
    if not result.allowed:
        raise downgrades.DowngradeRefused(
            f"{len(result.refusals)} refusal(s) for migrate {' '.join(result.target)}"
        )
