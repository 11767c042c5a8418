"""Migrations on every engine (SQLite, PostgreSQL, MariaDB; `make test` runs this file on all
three): from an empty database and back to zero, a populated round trip with the schema compared
before and after, the one-active-upgrade-per-Dataset rule, the migration graph, a failing
migration (BC-30), and the guarded downgrades (the space-bound API keys; `sqlmigrate
--backwards`; `kfs downgrade-check`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from knowledgefs.downgrades import REFUSED_EXIT_STATUS, DowngradeRefused
from knowledgefs.testing.migration_support import applied, kfs_check, migrate, migrate_to_latest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_APPS = ("knowledgefs", "spaces", "ingestion", "retrieval", "upgrades")
# Reversed in this order to reach an empty database (each `migrate APP zero` also reverses the
# other apps' migrations that depend on it).
ZERO_ORDER = ("spaces", "knowledgefs", "django_q", "admin", "sessions", "auth", "contenttypes")
BEFORE_SPACE_KEYS = "0002_api_key_bindings"  # spaces: reversing 0003 is the guarded step
GUARDED = ("spaces", "0003_bindings_from_scoped_keys")


@pytest.fixture(autouse=True)
def own_epoch_file(settings, tmp_path):
    """This test's API-key revocation epoch (KNOWLEDGE_VAR_DIR may be shared by other runs)."""
    settings.KNOWLEDGE_AUTH_EPOCH_FILE = tmp_path / "var" / "auth" / "revocation-epoch"


def schema() -> dict:
    """Every table's columns (name, type, null) and constraints (columns, primary key, unique,
    foreign key, check, index, index type), as the engine reports them."""
    introspection = connection.introspection
    snapshot = {}
    with connection.cursor() as cursor:
        for table in sorted(introspection.table_names(cursor)):
            columns = [
                (c.name, c.type_code, c.null_ok)
                for c in introspection.get_table_description(cursor, table)
            ]
            constraints = {
                name: (
                    tuple(info["columns"] or ()),
                    info["primary_key"],
                    info["unique"],
                    tuple(info["foreign_key"] or ()),
                    info["check"],
                    info["index"],
                    str(info.get("type")),
                )
                for name, info in introspection.get_constraints(cursor, table).items()
                # PostgreSQL's HNSW indexes follow the embedding models in use (created at run
                # time, retrieval.backends.pgvector), not the migrations.
                if not name.startswith("retrieval_dense_hnsw_")
            }
            snapshot[table] = {"columns": columns, "constraints": constraints}
    return snapshot


def row_counts() -> dict[str, int]:
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        counts = {}
        for table in sorted(connection.introspection.table_names(cursor)):
            cursor.execute(f"SELECT COUNT(*) FROM {quote(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def project_tables() -> set[str]:
    prefixes = tuple(f"{app}_" for app in PROJECT_APPS) + ("upgrade_", "django_q_")
    return {t for t in connection.introspection.table_names() if t.startswith(prefixes)}


def secret_and_hash(name: str) -> tuple[str, str]:
    secret = f"kfs_{name:0>8}{'y' * 40}"
    return secret, hashlib.sha256(secret.encode()).hexdigest()


def populate() -> dict:
    """Rows in every app's main tables: spaces with profiles, API keys of every kind with their
    bindings, a document with a job, a node, an index version and a vector, idempotency and
    capability-grant records, and upgrade jobs with a document and a file lease."""
    from ingestion.models import CompilationJob, Document, KnowledgeNode
    from knowledgefs.models import CapabilityGrant, IdempotencyRecord
    from retrieval.models import DenseVector, IndexVersion
    from spaces.models import ApiKey, ApiKeyBinding
    from spaces.services import Principal, create_space
    from upgrades.models import UpgradeDocument, UpgradeFileLease, UpgradeJob

    tenant = "mig-tenant"
    space = create_space(Principal(tenant_id=tenant), name="Round trip", slug="round-trip")
    other = create_space(Principal(tenant_id=tenant), name="Other", slug="other")

    def key(name: str) -> ApiKey:
        return ApiKey.objects.create(
            tenant_id=tenant, name=name, prefix=name, key_hash=secret_and_hash(name)[1]
        )

    space_only, mixed, dataset_only = key("spaceonly"), key("mixed"), key("dsonly")
    key("wholetenant")
    ApiKeyBinding.objects.create(
        api_key=space_only, resource_type="knowledge_fs_space", space=space
    )
    ApiKeyBinding.objects.create(api_key=mixed, resource_type="knowledge_fs_space", space=space)
    ApiKeyBinding.objects.create(api_key=mixed, resource_type="dataset", dataset_id="ds-1")
    ApiKeyBinding.objects.create(api_key=dataset_only, resource_type="dataset", dataset_id="ds-2")

    document = Document.objects.create(
        space=space,
        tenant_id=tenant,
        filename="notes.txt",
        mime_type="text/plain",
        size_bytes=5,
        sha256="a" * 64,
        storage_key=f"{tenant}/{uuid.uuid4().hex}",
        state="published",
    )
    CompilationJob.objects.create(
        space=space, document=document, tenant_id=tenant, stage="published", run_state="succeeded"
    )
    node = KnowledgeNode.objects.create(
        id=uuid.uuid4(),
        generation=uuid.uuid4(),
        chunk_index=0,
        text="hello",
        start_offset=0,
        end_offset=5,
        document=document,
        space=space,
    )
    now = timezone.now()
    IndexVersion.objects.create(
        space=space,
        number=1,
        model_id="m",
        dimension=4,
        state="active",
        activated_at=timezone.now(),
    )
    DenseVector.objects.create(
        node=node, space=space, index_version=1, model_id="m", dimension=4, vector=b"\0" * 16
    )
    IdempotencyRecord.objects.create(owner=f"key:{mixed.id}", key="k1", fingerprint="f" * 64)
    CapabilityGrant.objects.create(grant_id="grant-1", tenant_id=tenant)
    job = UpgradeJob.objects.create(
        tenant_id=tenant,
        dataset_id="ds-1",
        idempotency_key="idem-1",
        requested_by="u1",
        owner="u1",
        snapshot_at=now,
        status="succeeded",
        space=space,
        reconcile_completed_at=now,  # finished: an unfinished job blocks upgrades.0001's reversal
    )
    UpgradeJob.objects.create(
        tenant_id=tenant,
        dataset_id="ds-1",
        idempotency_key="idem-2",
        requested_by="u1",
        owner="u1",
        snapshot_at=now,
        status="failed",
    )
    UpgradeDocument.objects.create(
        job=job,
        tenant_id=tenant,
        legacy_document_id="legacy-1",
        name="notes.txt",
        data_source_type="upload_file",
        document=document,
    )
    UpgradeFileLease.objects.create(job=job, upload_file_id="file-1", expires_at=now)
    return {
        "tenant": tenant,
        "space": space,
        "other": other,
        "space_only": space_only,
        "mixed": mixed,
        "dataset_only": dataset_only,
    }


def bindings_at(target: tuple[str, str]) -> dict[str, set]:
    """``{key prefix: {(type, space id or dataset id)}}`` read with the models of ``target``."""
    apps = MigrationLoader(connection).project_state(target).apps
    Binding = apps.get_model("spaces", "ApiKeyBinding")
    found: dict[str, set] = {}
    for prefix, kind, space_id, dataset_id in Binding.objects.values_list(
        "api_key__prefix", "resource_type", "space_id", "dataset_id"
    ):
        found.setdefault(prefix, set()).add((kind, str(space_id) if space_id else dataset_id))
    return found


def admin_client() -> Client:
    user = get_user_model().objects.create_superuser("mig-admin", "a@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def api_status(secret: str) -> int:
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}").get("/v1/knowledge-spaces").status_code


# --- (a) an empty database: to zero and forward again; (c) the schema is identical -------------


@pytest.mark.django_db(transaction=True)
def test_every_app_migrates_to_zero_and_forward_again_with_an_identical_schema():
    before = schema()
    assert {"upgrade_job", "upgrade_document", "upgrade_file_lease"} <= set(before)
    try:
        for app in ZERO_ORDER:
            migrate(app, "zero")
        assert not {(a, n) for a, n in applied() if a in PROJECT_APPS}
        assert project_tables() == set()
        forward = migrate()
        assert "Applying upgrades.0001_upgrade_jobs... OK" in forward
    finally:
        migrate_to_latest()
    after = schema()
    assert sorted(after) == sorted(before)
    for table in before:
        assert after[table] == before[table], table


# --- (b) a populated database: backwards as far as the guards allow, forward again ------------


@pytest.mark.django_db(transaction=True)
def test_a_populated_database_goes_to_zero_and_back_once_no_key_is_bound_only_to_spaces():
    from spaces.models import ApiKey

    rows = populate()
    ApiKey.objects.filter(id=rows["space_only"].id).update(revoked_at=timezone.now())
    before = schema()
    try:
        for app in ZERO_ORDER:
            migrate(app, "zero")
        assert project_tables() == set()
        migrate()
    finally:
        migrate_to_latest()
    assert schema() == before
    # Data does not survive `zero` (the tables go); the schema takes new rows as before.
    again = populate()
    assert ApiKey.objects.filter(id=again["mixed"].id).exists()


# --- guarded downgrade of the space-bound API keys, populated (spec §5.6 case 34) ---------------


@pytest.mark.django_db(transaction=True)
def test_the_space_key_downgrade_is_refused_until_the_key_is_revoked_through_the_admin():
    rows = populate()
    space_only_secret = secret_and_hash("spaceonly")[0]
    mixed_secret = secret_and_hash("mixed")[0]
    assert api_status(space_only_secret) == 200  # authenticated, and now cached
    assert api_status(mixed_secret) == 200
    history, counts = applied(), row_counts()
    target = ("spaces", BEFORE_SPACE_KEYS)
    try:
        # Named through spaces, the plan also reverses upgrades.0001 first: refused before it.
        with pytest.raises(DowngradeRefused) as refused:
            migrate("spaces", BEFORE_SPACE_KEYS)
        message = str(refused.value)
        assert "before any migration ran; nothing was changed" in message
        assert "spaces.0003_bindings_from_scoped_keys: space_only_api_keys" in message
        assert "[1: spaceonly]" in message and "mixed" not in message.split("[")[-1]
        assert "kfs apikey revoke" in message and "/admin/spaces/apikey/" in message
        assert refused.value.returncode == REFUSED_EXIT_STATUS
        assert applied() == history
        assert row_counts() == counts
        # As far as the guard allows: down to spaces.0003 (the keys' bindings untouched), back.
        migrate("spaces", "0003")
        assert ("spaces", "0004_remove_scoped_and_space_memberships") not in applied()
        assert bindings_at(GUARDED)["spaceonly"] == {("knowledge_fs_space", str(rows["space"].id))}
        migrate_to_latest()
        assert applied() == history

        # Revocation through the admin (HTTP) clears the cached authentication at once.
        response = admin_client().post(
            "/admin/spaces/apikey/",
            {"action": "revoke", "_selected_action": [str(rows["space_only"].id)]},
        )
        assert response.status_code == 302
        assert api_status(space_only_secret) == 401
        assert api_status(mixed_secret) == 200

        out = migrate("spaces", BEFORE_SPACE_KEYS)
        assert "Unapplying upgrades.0001_upgrade_jobs... OK" in out
        assert "Unapplying spaces.0003_bindings_from_scoped_keys... OK" in out
        assert ("spaces", "0003_bindings_from_scoped_keys") not in applied()
        space_id = str(rows["space"].id)
        bound = bindings_at(target)
        # The mixed key keeps only its dataset binding; nothing fell to zero bindings.
        assert bound["mixed"] == {("dataset", "ds-1")}
        assert bound["dsonly"] == {("dataset", "ds-2")}
        assert bound["spaceonly"] == {("knowledge_fs_space", space_id)}  # revoked, kept
        assert "wholetenant" not in bound
        # Their space scope lives in the many-to-many again (the schema of this version).
        OldKey = (
            MigrationLoader(connection).project_state(target).apps.get_model("spaces", "ApiKey")
        )
        old = {k.prefix: k for k in OldKey.objects.all()}
        assert old["mixed"].scoped and [str(s.id) for s in old["mixed"].spaces.all()] == [space_id]
        assert old["dsonly"].scoped and not old["dsonly"].spaces.exists()
        assert not old["wholetenant"].scoped
    finally:
        migrate_to_latest()
    bound = bindings_at(MigrationLoader(connection).graph.leaf_nodes("spaces")[0])
    assert bound["mixed"] == {("dataset", "ds-1"), ("knowledge_fs_space", str(rows["space"].id))}
    assert bound["spaceonly"] == {("knowledge_fs_space", str(rows["space"].id))}
    assert api_status(space_only_secret) == 401
    listed = APIClient(HTTP_AUTHORIZATION=f"Bearer {mixed_secret}").get("/v1/knowledge-spaces")
    assert [s["id"] for s in listed.json()["results"]] == [str(rows["space"].id)]


@pytest.mark.django_db(transaction=True)
def test_the_guard_inside_the_migration_refuses_when_the_executor_is_driven_directly():
    """Without `manage.py migrate` (no pre_migrate), the migration's own guard refuses."""
    try:
        migrate("spaces", "0003")
        apps = MigrationLoader(connection).project_state(GUARDED).apps
        Key, Space = apps.get_model("spaces", "ApiKey"), apps.get_model("spaces", "KnowledgeSpace")
        Binding = apps.get_model("spaces", "ApiKeyBinding")
        space = Space.objects.create(tenant_id="t", name="S", slug="s")
        key = Key.objects.create(tenant_id="t", prefix="direct", key_hash="h" * 64)
        Binding.objects.create(api_key=key, resource_type="knowledge_fs_space", space=space)
        executor = MigrationExecutor(connection)
        with pytest.raises(DowngradeRefused, match=r"not reversed: .*\[1: direct\]"):
            executor.migrate([("spaces", BEFORE_SPACE_KEYS)])
        assert GUARDED in applied()
        assert Binding.objects.filter(api_key=key).count() == 1
    finally:
        migrate_to_latest()


# --- sqlmigrate --backwards (spec §5.6 case 35) and kfs downgrade-check -------------------------


@pytest.mark.django_db(transaction=True)  # SQLite's schema editor refuses an open transaction
def test_sqlmigrate_backwards_of_the_space_keys_refuses_and_forwards_prints_sql():
    with pytest.raises(DowngradeRefused, match="SQL printed by sqlmigrate cannot make"):
        call_command("sqlmigrate", "spaces", "0003", "--backwards", stdout=StringIO())
    out = StringIO()
    call_command("sqlmigrate", "spaces", "0003", stdout=out)
    assert "Refuse reversing spaces.0003_bindings_from_scoped_keys" in out.getvalue()


def test_sqlmigrate_backwards_exits_non_zero_in_a_real_process(tmp_path):
    env = dict(os.environ, KNOWLEDGE_VAR_DIR=str(tmp_path / "var"))
    run = subprocess.run(
        [sys.executable, "manage.py", "sqlmigrate", "--backwards", "spaces", "0003"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == REFUSED_EXIT_STATUS, run.stderr
    assert "DowngradeRefused: spaces.0003_bindings_from_scoped_keys: refused" in run.stderr
    assert "BEGIN" not in run.stdout and "DELETE" not in run.stdout


@pytest.mark.django_db
def test_kfs_downgrade_check_prints_the_plan_and_the_refusals_and_changes_nothing():
    rows = populate()
    history, counts = applied(), row_counts()
    status, text = kfs_check("spaces", "0002")
    assert status == REFUSED_EXIT_STATUS
    assert re.search(r"^plan for migrate spaces 0002_api_key_bindings: \d+ step\(s\)$", text, re.M)
    assert "  upgrades.0001_upgrade_jobs  backwards" in text
    assert "  spaces.0003_bindings_from_scoped_keys  backwards" in text
    assert "refused: spaces.0003_bindings_from_scoped_keys: space_only_api_keys" in text
    status, text = kfs_check("spaces", "0002", "--json")
    report = json.loads(text)
    assert report["allowed"] is False
    # Every migration that depends on spaces 0003-0005 (upgrades.0001 and any later upgrades
    # migration among them) first, then spaces 0005, 0004, 0003.
    steps = [step["migration"] for step in report["plan"]]
    assert {step["direction"] for step in report["plan"]} == {"backwards"}
    assert "upgrades.0001_upgrade_jobs" in steps[:-3]
    assert steps[-3:] == [
        "spaces.0005_space_profiles",
        "spaces.0004_remove_scoped_and_space_memberships",
        "spaces.0003_bindings_from_scoped_keys",
    ]
    assert report["refusals"] == [
        {
            "migration": "spaces.0003_bindings_from_scoped_keys",
            "code": "space_only_api_keys",
            "message": report["refusals"][0]["message"],
            "count": 1,
            "prefixes": ["spaceonly"],
        }
    ]
    # A plan that leaves the key bindings alone is allowed, whatever it reverses.
    status, text = kfs_check("knowledgefs", "zero", "--json")
    assert status == 0 and json.loads(text)["allowed"] is True
    assert json.loads(text)["plan"][-1] == {
        "migration": "knowledgefs.0001_initial",
        "direction": "backwards",
    }
    status, text = kfs_check("spaces", "0004")
    assert status == 0 and text.rstrip().endswith("allowed")
    assert applied() == history and row_counts() == counts
    from spaces.models import ApiKey

    ApiKey.objects.filter(id=rows["space_only"].id).update(revoked_at=timezone.now())
    assert kfs_check("spaces", "0002")[0] == 0


@pytest.mark.django_db
def test_kfs_downgrade_check_names_an_unknown_app_or_migration():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="app 'nope' has no migrations"):
        kfs_check("nope", "zero")
    with pytest.raises(CommandError, match="no migration of 'spaces' matches '0099'"):
        kfs_check("spaces", "0099")
    with pytest.raises(CommandError, match="matches several migrations of 'spaces'"):
        kfs_check("spaces", "000")


# --- (d) one active upgrade per Dataset, on each engine ---------------------------------------


def new_job(tenant: str, dataset: str, status: str, n: int):
    from upgrades.models import UpgradeJob

    return UpgradeJob.objects.create(
        tenant_id=tenant,
        dataset_id=dataset,
        idempotency_key=f"idem-{dataset}-{n}",
        requested_by="u",
        owner="u",
        snapshot_at=timezone.now(),
        status=status,
    )


@pytest.mark.django_db
def test_two_finished_upgrades_of_a_dataset_are_allowed_a_second_active_one_never():
    from upgrades.models import UpgradeJob

    new_job("t1", "ds", "succeeded", 1)
    new_job("t1", "ds", "failed", 2)
    done = new_job("t1", "ds", "succeeded", 3)
    active = new_job("t1", "ds", "queued", 4)
    new_job("t2", "ds", "running", 5)  # another tenant's dataset of the same id
    for status in ("queued", "running"):
        with pytest.raises(IntegrityError), transaction.atomic():
            new_job("t1", "ds", status, 10)
    # Back from succeeded to queued while another is active: refused too.
    with pytest.raises(IntegrityError), transaction.atomic():
        UpgradeJob.objects.filter(id=done.id).update(status="queued")
    UpgradeJob.objects.filter(id=active.id).update(status="running")
    with pytest.raises(IntegrityError), transaction.atomic():
        UpgradeJob.objects.filter(id=done.id).update(status="running")
    UpgradeJob.objects.filter(id=active.id).update(status="failed")
    UpgradeJob.objects.filter(id=done.id).update(status="queued")  # now the only active one
    assert UpgradeJob.objects.filter(tenant_id="t1", status__in=["queued", "running"]).count() == 1


@pytest.mark.django_db
def test_the_uniqueness_rule_is_the_engine_s_own_object():
    """PostgreSQL/SQLite: the partial unique index; MySQL/MariaDB: the unique index over the
    stored generated column (the partial one does not exist there)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "upgrade_job")
        columns = {
            c.name for c in connection.introspection.get_table_description(cursor, "upgrade_job")
        }
    assert "active_dataset_id" in columns
    if connection.vendor == "mysql":
        assert "upgrade_job_active_dataset_uq" not in constraints
        index = constraints["upgrade_job_active_dataset_gen_uq"]
        assert index["unique"] and index["columns"] == ["tenant_id", "active_dataset_id"]
    else:
        index = constraints["upgrade_job_active_dataset_uq"]
        assert index["unique"] and index["columns"] == ["tenant_id", "dataset_id"]
        assert "upgrade_job_active_dataset_gen_uq" not in constraints


# --- (e) the migration graph -------------------------------------------------------------------


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


GENERATED_FROM = {"status", "dataset_id"}  # the inputs of upgrade_job.active_dataset_id


def test_a_later_migration_altering_the_generated_column_s_inputs_drops_it_first():
    """PostgreSQL refuses ALTER TYPE of a column a generated column uses: a migration that alters
    UpgradeJob.status or dataset_id must remove active_dataset_id before, in that migration."""
    from django.db.migrations.operations import AlterField, RemoveField, RenameField

    loader = MigrationLoader(None, ignore_no_migrations=True)
    for (app, name), migration in loader.disk_migrations.items():
        if (app, name) == ("upgrades", "0001_upgrade_jobs"):
            continue
        removed = False
        for operation in migration.operations:
            if getattr(operation, "model_name", "").lower() != "upgradejob":
                continue
            if isinstance(operation, RemoveField) and operation.name == "active_dataset_id":
                removed = True
            touched = {getattr(operation, "name", None), getattr(operation, "old_name", None)}
            if isinstance(operation, AlterField | RenameField) and touched & GENERATED_FROM:
                assert removed, (
                    f"{app}.{name} alters UpgradeJob.{touched & GENERATED_FROM} without removing "
                    "active_dataset_id first (PostgreSQL refuses it; see upgrades/models/jobs.py)"
                )


def test_one_leaf_per_app_and_the_upgrade_migrations_descend_from_what_they_need():
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    leaves: dict[str, list[str]] = {}
    for app, name in graph.leaf_nodes():
        leaves.setdefault(app, []).append(name)
    for app in PROJECT_APPS:
        assert len(leaves[app]) == 1, (app, leaves[app])
    first = ("upgrades", "0001_upgrade_jobs")
    assert graph.node_map[first].parents >= {
        graph.node_map[("ingestion", "0005_artifact_assets")],
        graph.node_map[("spaces", "0005_space_profiles")],
    }
    # Every later upgrades migration descends from the first (one chain, one head).
    head = ("upgrades", leaves["upgrades"][0])
    assert first in graph.forwards_plan(head)
    for app in ("ingestion", "retrieval", "upgrades"):
        assert ("spaces", "0001_initial") in graph.forwards_plan((app, leaves[app][0]))


# --- BC-30: a failing migration makes `migrate` exit non-zero ---------------------------------


@pytest.fixture
def throwaway_database(tmp_path):
    """A database of its own for a `manage.py` subprocess (never the test database): a file on
    SQLite, a new database on the server otherwise; dropped afterwards."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "bc30.sqlite3")
        return
    name = f"kfs_bc30_{uuid.uuid4().hex[:12]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.mark.django_db(transaction=True)
def test_a_failing_migration_exits_non_zero_advances_no_history_and_keeps_the_app_unready(
    throwaway_database, tmp_path
):
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="knowledgefs.testing.settings_failing_migration",
        KFS_TEST_DB_NAME=throwaway_database,
        KNOWLEDGE_VAR_DIR=str(tmp_path / "var"),
    )

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    run = manage("migrate", "--noinput")
    assert run.returncode != 0
    assert "Applying failing_migration_app.0001_duplicate_index..." in run.stdout
    assert "failing_probe_name_idx" in run.stderr  # the engine's own error, printed
    assert "Applying upgrades.0001_upgrade_jobs... OK" in run.stdout  # the others applied
    shown = manage(
        "shell",
        "-c",
        "from django.db.migrations.recorder import MigrationRecorder as R; "
        "from django.db import connection as c; "
        "from knowledgefs.health import check_database; "
        "print(sorted(a for a, n in R(c).applied_migrations()))\n"
        "print(check_database())",
    )
    assert shown.returncode == 0, shown.stderr
    history, readiness = shown.stdout.strip().splitlines()[-2:]
    assert "'upgrades'" in history and "failing_migration_app" not in history
    assert re.fullmatch(
        r"\(False, 'failing', \"[1-9][0-9]* unapplied migrations; run 'manage.py migrate'\"\)",
        readiness,
    ), readiness
    again = manage("migrate", "--noinput")
    assert again.returncode != 0  # still failing, still not recorded


# --- every partial unique index has its MySQL/MariaDB counterpart ------------------------------


def test_every_conditional_unique_constraint_has_a_mysql_counterpart():
    from django.apps import apps
    from django.db.models import UniqueConstraint

    from knowledgefs.mysql import MYSQL_UNIQUE_COUNTERPARTS

    conditional = {
        c.name: model._meta.db_table
        for model in apps.get_models()
        if model._meta.app_label in PROJECT_APPS
        for c in model._meta.constraints
        if isinstance(c, UniqueConstraint) and c.condition is not None
    }
    assert set(conditional) == set(MYSQL_UNIQUE_COUNTERPARTS)
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    for name, table in conditional.items():
        counterpart_table, _, migration = MYSQL_UNIQUE_COUNTERPARTS[name]
        assert counterpart_table == table
        assert tuple(migration.split(".")) in graph.nodes


@pytest.mark.django_db
def test_the_counterparts_exist_on_mysql_and_the_partial_indexes_elsewhere():
    from knowledgefs.mysql import MYSQL_UNIQUE_COUNTERPARTS

    with connection.cursor() as cursor:
        for name, (table, counterpart, _) in MYSQL_UNIQUE_COUNTERPARTS.items():
            constraints = connection.introspection.get_constraints(cursor, table)
            present = counterpart if connection.vendor == "mysql" else name
            absent = name if connection.vendor == "mysql" else counterpart
            assert constraints[present]["unique"], (table, present)
            assert absent not in constraints, (table, absent)


@pytest.mark.django_db
def test_one_live_compilation_job_per_document_and_one_active_index_version_per_space():
    from ingestion.models import CompilationJob, Document
    from retrieval.models import IndexVersion
    from spaces.services import Principal, create_space

    space = create_space(Principal(tenant_id="uq"), name="Unique", slug="unique")
    document = Document.objects.create(
        space=space,
        tenant_id="uq",
        filename="a.txt",
        mime_type="text/plain",
        size_bytes=1,
        sha256="b" * 64,
        storage_key="uq/a",
    )

    def job(run_state: str):
        return CompilationJob.objects.create(
            space=space, document=document, tenant_id="uq", run_state=run_state
        )

    job("succeeded"), job("failed"), job("queued")
    for live in ("queued", "running", "retry_wait", "dispatch_pending"):
        with pytest.raises(IntegrityError), transaction.atomic():
            job(live)

    def version(number: int, state: str):
        return IndexVersion.objects.create(
            space=space, number=number, model_id="m", dimension=4, state=state
        )

    version(1, "retired"), version(2, "retired"), version(3, "active"), version(4, "building")
    for number, state in ((5, "active"), (6, "building")):
        with pytest.raises(IntegrityError), transaction.atomic():
            version(number, state)
    assert IndexVersion.objects.filter(space=space).count() == 4


def test_a_mysql_database_url_configures_utf8mb4_read_committed_and_strict_mode(tmp_path):
    env = dict(
        os.environ,
        DATABASE_URL="mysql://kfs:pw@127.0.0.1:3307/kfs",
        KNOWLEDGE_VAR_DIR=str(tmp_path / "var"),
    )
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, django; django.setup(); from django.conf import settings as s; "
            "import MySQLdb; d = s.DATABASES['default']; "
            "print(json.dumps([d['ENGINE'], d['NAME'], d['HOST'], d['PORT'], d['OPTIONS'], "
            "d['TEST'], s.SILENCED_SYSTEM_CHECKS, MySQLdb.version_info[:3]]))",
        ],
        cwd=ROOT,
        env=dict(env, DJANGO_SETTINGS_MODULE="knowledgefs.settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    engine, name, host, port, options, test, silenced, version = json.loads(run.stdout)
    assert (engine, name, host, port) == ("django.db.backends.mysql", "kfs", "127.0.0.1", 3307)
    assert options == {
        "charset": "utf8mb4",
        "isolation_level": "read committed",
        "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
    }
    assert (test["CHARSET"], test["COLLATION"]) == ("utf8mb4", "utf8mb4_unicode_ci")
    assert silenced == ["models.W036", "models.W037", "mysql.W003"]
    assert version >= [1, 4, 3]  # Django 5.2's minimum MySQLdb version


# --- spec §5.6 case 31: the tables are the models' columns; the downgrade leaves none ---------


@pytest.mark.django_db(transaction=True)
def test_every_table_has_its_model_s_columns_and_the_upgrades_downgrade_leaves_no_table():
    from django.apps import apps

    from knowledgefs.mysql import MYSQL_EXTRA_COLUMNS
    from retrieval.backends import pgvector

    with connection.cursor() as cursor:
        for model in apps.get_models():
            if model._meta.app_label not in PROJECT_APPS:
                continue
            table = model._meta.db_table
            expected = {f.column for f in model._meta.concrete_fields}
            if connection.vendor == "mysql":
                expected |= MYSQL_EXTRA_COLUMNS.get(table, set())
            if connection.vendor == "postgresql" and table == pgvector.TABLE:
                expected.add(pgvector.COLUMN)  # the pgvector column of retrieval.0008
            found = {c.name for c in connection.introspection.get_table_description(cursor, table)}
            assert found == expected, table
    upgrade_tables = {"upgrade_job", "upgrade_document", "upgrade_file_lease"}
    assert upgrade_tables <= set(connection.introspection.table_names())
    try:
        migrate("upgrades", "zero")
        assert not {t for t in connection.introspection.table_names() if t.startswith("upgrade_")}
    finally:
        migrate_to_latest()
    assert upgrade_tables <= set(connection.introspection.table_names())


# --- the MariaDB runner without MariaDB ----------------------------------------------------------


@pytest.mark.parametrize(
    ("required", "status", "message"),
    [
        ("", 0, "skipping the MariaDB run"),
        ("1", 1, "KFS_REQUIRE_MARIADB=1 makes this a failure"),
    ],
)
def test_the_mariadb_runner_skips_without_mariadbd_unless_required(
    tmp_path, required, status, message
):
    env = dict(os.environ, PATH=str(tmp_path), KFS_REQUIRE_MARIADB=required)
    run = subprocess.run(
        [sys.executable, "scripts/with_mariadb.py", "--skip-if-missing", "true"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == status, run.stderr
    assert "MariaDB is not installed (mariadbd not on PATH; run `make mariadb`)" in (
        run.stdout + run.stderr
    )
    assert message in run.stdout + run.stderr


@pytest.mark.django_db
def test_a_query_on_mysql_is_a_typed_503_and_ready_reports_search_failing(client, settings):
    """Retrieval has search backends for SQLite and PostgreSQL only: on MySQL/MariaDB a query
    is 503 ``search_backend_unavailable`` (never a 500) and ``/ready`` names ``search``; on the
    other engines the same query runs and ``search`` is ok."""
    from knowledgefs import health

    health.reset()
    space = client.post("/v1/knowledge-spaces", {"name": "Engines"}, format="json").json()
    url = f"/v1/knowledge-spaces/{space['id']}/retrieval-tests"
    answer = client.post(url, {"query": "coral reef"}, format="json")
    search = client.get("/ready").json()["checks"]["search"]
    if connection.vendor == "mysql":
        assert answer.status_code == 503, answer.json()
        assert answer.json()["code"] == "search_backend_unavailable"
        assert answer.json()["details"] == {"vendor": "mysql"}
        assert (
            "MySQL/MariaDB is supported for the schema, migrations and downgrades only"
            in (answer.json()["message"])
        )
        assert (search["ok"], search["state"]) == (False, "failing")
        assert search["detail"].startswith("no search backend for the database engine MySQL")
    else:
        assert answer.status_code != 503 and answer.status_code < 500, answer.json()
        assert (search["ok"], search["state"]) == (True, "ok")
        assert search["detail"].startswith(connection.vendor)
