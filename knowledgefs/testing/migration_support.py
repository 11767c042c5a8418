"""Helpers shared by the migration and downgrade-guard tests (engine-neutral)."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from knowledgefs.downgrades import DowngradeRefused


def migrate(*args: str) -> str:
    """``manage.py migrate ARGS --noinput``; returns its output (verbosity 1)."""
    out = StringIO()
    call_command("migrate", *args, "--noinput", stdout=out, verbosity=1)
    return out.getvalue()


def migrate_to_latest() -> None:
    """Every app to its latest migration, quietly."""
    call_command("migrate", "--noinput", verbosity=0)


def applied() -> set[tuple[str, str]]:
    """The applied migrations as ``{(app, name)}``."""
    return set(MigrationRecorder(connection).applied_migrations())


def kfs_check(*args: str) -> tuple[int, str]:
    """``kfs downgrade-check ARGS`` as ``(exit status, output)``: 0 allowed, else refused."""
    out = StringIO()
    try:
        call_command("kfs", "downgrade-check", *args, stdout=out)
    except DowngradeRefused as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()
