"""Migration operations shared by the apps' migrations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import migrations
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState, StateApps

if TYPE_CHECKING:  # the stubs' name for what RunSQL takes (not in django at run time)
    from django.db.migrations.operations.special import _SqlOperations

#: ``build(connection) -> (forward statements, backward statements)`` of :class:`MySQLRunSQL`.
StatementsBuilder = Callable[[BaseDatabaseWrapper], tuple[Sequence[str], Sequence[str]]]


class VendorRunSQL(migrations.RunSQL):
    """``RunSQL`` that runs only on the named database vendors (``connection.vendor``, e.g.
    ``"mysql"``, which covers MariaDB) and does nothing elsewhere, forwards and backwards.

    Use it for a schema object only one engine needs and the model state must not know, such as
    the unique index over a stored generated column that stands in for a partial unique index on
    MySQL/MariaDB (which have none). Reversible when ``reverse_sql`` is given.
    """

    def __init__(
        self,
        vendors: tuple[str, ...],
        sql: _SqlOperations,
        reverse_sql: _SqlOperations | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sql, reverse_sql, **kwargs)
        self.vendors = tuple(vendors)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        name, args, kwargs = super().deconstruct()
        kwargs["vendors"] = self.vendors
        return name, args, kwargs

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if schema_editor.connection.vendor in self.vendors:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if schema_editor.connection.vendor in self.vendors:
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"Raw SQL on {', '.join(self.vendors)} only"


class GuardedReversal(Operation):
    """Nothing forwards; backwards, the check of the guard registered for this migration in
    :mod:`knowledgefs.downgrades` (``guard`` = ``"app_label.migration_name"``).

    Put it **last** in the migration's operations so that it runs first when the migration is
    reversed. Under ``sqlmigrate --backwards`` (``schema_editor.collect_sql``) it always raises
    ``DowngradeRefused``: the guard needs a live query that printed SQL cannot make. It reduces
    to SQL (``reduces_to_sql``) precisely so that ``sqlmigrate`` calls it instead of printing a
    "cannot be written as SQL" comment and going on. ``manage.py migrate`` refuses the same plan
    earlier, before any migration runs (the ``pre_migrate`` receiver); this is the second line
    for a migration run by other means.
    """

    reduces_to_sql = True
    reversible = True

    def __init__(self, guard: str) -> None:
        self.guard = guard

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        return (self.__class__.__name__, [], {"guard": self.guard})

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        pass

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        from knowledgefs import downgrades

        app_label, name = self.guard.split(".", 1)
        guard = downgrades.GUARDS[(app_label, name)]
        if schema_editor.collect_sql:
            raise downgrades.DowngradeRefused(f"{self.guard}: {guard.sql_only_message}")
        refusal = guard.evaluate(from_state.apps, schema_editor.connection.alias)
        if refusal is not None:
            raise downgrades.DowngradeRefused(f"not reversed: {refusal.text()}")

    def describe(self) -> str:
        return f"Refuse reversing {self.guard} while its downgrade guard holds"


def uuid_column_type(connection: BaseDatabaseWrapper) -> str:
    """The column type Django gives a ``UUIDField`` on ``connection``: ``uuid`` on PostgreSQL and
    MariaDB ≥ 10.7, ``char(32)`` (hex, no dashes) on MySQL and SQLite. Raw SQL that stores UUIDs
    beside Django's columns must use the same type (a dashed MariaDB uuid is 36 characters)."""
    from django.db import models

    db_type = models.UUIDField().db_type(connection)
    assert db_type is not None  # every backend Django ships has a uuid column type
    return db_type


class MySQLRunSQL(migrations.RunPython):
    """Statements run on MySQL/MariaDB only, forwards and backwards, built at run time by
    ``build(connection) -> (forward statements, backward statements)`` so that they can use the
    engine's own column types (:func:`uuid_column_type`). Not wrapped in a transaction: MySQL DDL
    cannot be rolled back, and Django refuses DDL inside an atomic block there."""

    def __init__(self, build: StatementsBuilder) -> None:
        self.build = build
        super().__init__(self._forwards, self._backwards, atomic=False)

    def _run(self, schema_editor: BaseDatabaseSchemaEditor, index: int) -> None:
        if schema_editor.connection.vendor != "mysql":
            return
        for statement in self.build(schema_editor.connection)[index]:
            schema_editor.execute(statement)

    def _forwards(self, apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        self._run(schema_editor, 0)

    def _backwards(self, apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        self._run(schema_editor, 1)

    def describe(self) -> str:
        return "SQL on MySQL/MariaDB only"


def every_minute_schedule(name: str, func: str) -> migrations.RunPython:
    """A reversible ``RunPython`` that owns one django-q2 schedule: forwards it creates (or
    resets) the schedule ``name`` calling the dotted ``func`` every minute, for ever (the unit of
    django-q2 interval schedules is the minute); backwards it deletes it. The migration must
    depend on django_q's migrations."""

    def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        apps.get_model("django_q", "Schedule").objects.update_or_create(
            name=name,
            defaults={"func": func, "schedule_type": "I", "minutes": 1, "repeats": -1},
        )

    def delete(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        apps.get_model("django_q", "Schedule").objects.filter(name=name).delete()

    return migrations.RunPython(create, delete)
