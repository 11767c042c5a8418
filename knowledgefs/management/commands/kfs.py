"""``python manage.py kfs …``: the operator's command line, a dispatcher over one command module
per app. Each module (``spaces/cli.py``, ``ingestion/cli.py``, ``retrieval/cli.py``,
``upgrades/cli.py``, ``knowledgefs/cli.py``) has ``add_parser(sub, name)``, which registers one
``kfs`` command, and ``handle(command, options)``, which runs it by calling a service.

:data:`COMMANDS` fixes the order of the commands in ``kfs --help``. A :class:`ServiceError`
becomes a :class:`CommandError` ``"<code>: <message>"`` (exit status 1)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingestion import cli as ingestion_cli
from knowledgefs import cli as core_cli
from knowledgefs.errors import ServiceError
from retrieval import cli as retrieval_cli
from retrieval.fs import cli as fs_cli
from retrieval.quality import cli as quality_cli
from spaces import cli as spaces_cli
from upgrades import cli as upgrades_cli

# (command, its module), in the order of `kfs --help`.
COMMANDS = (
    ("space", spaces_cli),
    ("apikey", spaces_cli),
    ("ingest", ingestion_cli),
    ("query", retrieval_cli),
    ("research-tasks", retrieval_cli),
    ("documents", ingestion_cli),
    ("jobs", ingestion_cli),
    ("stats", ingestion_cli),
    ("retry", ingestion_cli),
    ("cancel", ingestion_cli),
    ("schedules", ingestion_cli),
    ("sweep", ingestion_cli),
    ("storage", ingestion_cli),
    ("visual", ingestion_cli),
    ("downgrade-check", core_cli),
    ("cutover", upgrades_cli),
    ("upgrade", upgrades_cli),
    ("answer", retrieval_cli),
    ("eval", retrieval_cli),
    ("reindex", retrieval_cli),
    ("fs", fs_cli),
    ("mcp", fs_cli),
    ("golden", quality_cli),
    ("quality", quality_cli),
)


class Command(BaseCommand):
    help = (
        "KnowledgeFS operator commands: spaces, API keys, ingest, query, research tasks, "
        "documents, jobs, stats, retry, cancel, schedules, sweep, storage, visual, "
        "downgrade-check, cutover, upgrade, answer, eval, reindex, fs, mcp, golden, quality."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        for name, module in COMMANDS:
            module.add_parser(sub, name)

    def handle(self, *args: Any, **options: Any) -> None:
        module = dict(COMMANDS)[options["command"]]
        try:
            module.handle(self, options)
        except ServiceError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc

    def emit(self, options: dict[str, Any], payload: Any, text: str) -> None:
        """Write ``payload`` as indented JSON under ``--json``, else ``text``."""
        self.stdout.write(
            json.dumps(payload, ensure_ascii=False, indent=2) if options.get("json") else text
        )
