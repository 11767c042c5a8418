"""The cleanup-completion migration (upgrades 0004) both ways, on an empty and on a populated
table (spec §5.6 cases 32-33). Engine-neutral: it runs on SQLite, PostgreSQL and MariaDB.

Each test moves the real test database with Django's ``MigrationExecutor`` and puts every app
back on its latest migration afterwards.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from upgrades.models import CleanupAuthorization
from upgrades.services import cleanup
from upgrades.tests.test_cutover import ready

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "upgrade_cleanup_authorization"
BEFORE = ("upgrades", "0003_cleanup_authorizations")
AFTER = ("upgrades", "0004_cleanup_completion")
COMPLETION_COLUMNS = {
    "completed_by",
    "completed_at",
    "completion_evidence",
    "completed_ledger_cas_version",
}


def migrate(target):
    """Migrate the test database to ``target`` (a list of nodes); return the historical apps."""
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    executor.loader.build_graph()
    return executor.loader.project_state(target).apps


@pytest.fixture(autouse=True)
def back_to_latest():
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def schema() -> tuple[set[str], dict[str, tuple]]:
    """The table's columns and its check constraints (name → columns)."""
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(cursor, TABLE)}
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    checks = {
        name: tuple(sorted(info["columns"] or ()))
        for name, info in constraints.items()
        if info["check"] and name.startswith("upgrade_cleanup_")
    }
    return columns, checks


def test_completion_migration_is_symmetric_on_an_empty_table():
    latest_columns, latest_checks = schema()
    assert COMPLETION_COLUMNS <= latest_columns
    assert "upgrade_cleanup_completion_time_ck" in latest_checks

    migrate([BEFORE])
    old_columns, old_checks = schema()
    assert old_columns == latest_columns - COMPLETION_COLUMNS
    assert "upgrade_cleanup_completion_time_ck" not in old_checks
    assert {"upgrade_cleanup_status_ck", "upgrade_cleanup_status_fields_ck",
            "upgrade_cleanup_ledger_versions_ck", "upgrade_cleanup_four_eyes_ck",
            "upgrade_cleanup_approval_window_ck"} <= set(old_checks)  # fmt: skip

    migrate([AFTER])
    assert schema() == (latest_columns, latest_checks)


def completed_authorization(tenant: str) -> CleanupAuthorization:
    ready(tenant)
    found = cleanup.request_cleanup(tenant, requested_by="alice", reason="legacy data")
    found = cleanup.approve(found.id, expected_row_version=0, approved_by="bob")
    found = cleanup.start(
        found.id, expected_row_version=1, started_by="bob", evidence={"plan": "drop legacy"}
    )
    return cleanup.complete(
        found.id, expected_row_version=2, completed_by="carol", evidence={"rows_removed": 42}
    )


def test_downgrade_with_a_completed_authorization_moves_it_back_to_started(tenant):
    done = completed_authorization(tenant)
    assert (done.status, done.row_version) == ("completed", 3)
    assert done.completion_evidence == {"rows_removed": 42}

    old_apps = migrate([BEFORE])
    old = old_apps.get_model("upgrades", "CleanupAuthorization").objects.get(id=done.id)
    assert (old.status, old.row_version) == ("started", 4)
    assert (old.started_by, old.start_evidence) == ("bob", {"plan": "drop legacy"})
    assert old.started_ledger_cas_version == done.started_ledger_cas_version
    columns, _ = schema()
    assert not COMPLETION_COLUMNS & columns
    # The three-status check is back: "completed" is refused again.
    with pytest.raises(IntegrityError), transaction.atomic():
        old_apps.get_model("upgrades", "CleanupAuthorization").objects.filter(id=done.id).update(
            status="completed"
        )

    migrate([AFTER])
    again = CleanupAuthorization.objects.get(id=done.id)
    assert (again.status, again.row_version) == ("started", 4)
    assert again.completed_by is None and again.completed_at is None
    assert again.completion_evidence is None and again.completed_ledger_cas_version is None
    # The cleanup can be completed again under the new schema.
    finished = cleanup.complete(
        again.id, expected_row_version=4, completed_by="carol", evidence={"rows_removed": 42}
    )
    assert finished.status == "completed" and finished.completed_at >= finished.started_at
    assert finished.completed_at <= timezone.now()
