"""Guarded downgrades of document availability (ingestion.0007), the cutover ledgers
(upgrades.0002) and the upgrade jobs (upgrades.0001); sqlmigrate of the cleanup completion
(upgrades.0004); ``migrate --plan`` and ``kfs downgrade-check --database`` of a refused plan."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from knowledgefs.downgrades import REFUSED_EXIT_STATUS, DowngradeRefused
from knowledgefs.testing.migration_support import applied, kfs_check, migrate, migrate_to_latest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_epoch_file(settings, tmp_path):
    settings.KNOWLEDGE_AUTH_EPOCH_FILE = tmp_path / "var" / "auth" / "revocation-epoch"


def refused_migrate(*args: str) -> str:
    history = applied()
    with pytest.raises(DowngradeRefused) as refused:
        migrate(*args)
    assert refused.value.returncode == REFUSED_EXIT_STATUS
    assert applied() == history
    return str(refused.value)


def a_document(enabled: bool):
    from ingestion.models import Document
    from spaces.services import Principal, create_space

    space = create_space(Principal(tenant_id="guard-t"), name="G", slug=f"g-{uuid.uuid4().hex[:8]}")
    return Document.objects.create(
        space=space,
        tenant_id="guard-t",
        filename="dis.txt",
        mime_type="text/plain",
        size_bytes=5,
        sha256="a" * 64,
        storage_key=f"guard-t/{uuid.uuid4().hex}",
        state="published",
        enabled=enabled,
    )


@pytest.mark.django_db(transaction=True)
def test_reversing_document_availability_is_refused_while_a_document_is_disabled():
    from ingestion.models import Document

    a_document(True)
    disabled = a_document(False)
    try:
        status, text = kfs_check("ingestion", "0006")
        assert status == REFUSED_EXIT_STATUS
        assert "ingestion.0007_document_availability: disabled_documents" in text
        assert f"[1: {disabled.id}]" in text and "Enable or delete those documents" in text
        message = refused_migrate("ingestion", "0006")
        assert "disabled_documents" in message and str(disabled.id) in message
        assert Document.objects.get(id=disabled.id).enabled is False
        Document.objects.filter(id=disabled.id).update(enabled=True)
        assert kfs_check("ingestion", "0006")[0] == 0
        out = migrate("ingestion", "0006")
        assert "Unapplying ingestion.0007_document_availability... OK" in out
    finally:
        migrate_to_latest()


def cut_over(tenant: str):
    from upgrades.services import cutover

    ledger, _ = cutover.create_ledger(tenant)
    for phase in ("backfill", "shadow"):
        ledger = cutover.advance(
            tenant, expected_phase=ledger.phase, expected_cas_version=ledger.cas_version,
            to_phase=phase,
        )  # fmt: skip
    base = {"tenant_id": tenant, "ledger_cas_version": ledger.cas_version}
    ledger = cutover.advance(
        tenant, expected_phase="shadow", expected_cas_version=ledger.cas_version,
        to_phase="frozen", ack={**base, "freeze_id": "f-1", "freeze_revision": 1},
    )  # fmt: skip
    base = {"tenant_id": tenant, "ledger_cas_version": ledger.cas_version}
    return cutover.advance(
        tenant, expected_phase="frozen", expected_cas_version=ledger.cas_version,
        to_phase="cutover", ack={**base, "activation_id": "a-1", "activation_revision": 1},
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_reversing_the_cutover_ledgers_is_refused_while_a_gate_is_closed_or_cleanup_started():
    from upgrades.models import WorkspaceCutoverLedger
    from upgrades.services import cutover

    cutover.create_ledger("tenant-closed")  # inventory: product routes closed
    cleaning = cutover.mark_irreversible_cleanup(cut_over("tenant-clean"), now=timezone.now())
    cut_over("tenant-open")
    try:
        status, text = kfs_check("upgrades", "0001")
        assert status == REFUSED_EXIT_STATUS
        assert "upgrades.0002_cutover_ledger: cutover_ledgers_in_use" in text
        assert "[2: tenant-clean, tenant-closed]" in text
        assert "refused" in refused_migrate("upgrades", "0001")
        assert WorkspaceCutoverLedger.objects.count() == 3
        WorkspaceCutoverLedger.objects.filter(tenant_id="tenant-closed").delete()
        assert "[1: tenant-clean]" in kfs_check("upgrades", "0001")[1]
        WorkspaceCutoverLedger.objects.filter(id=cleaning.id).delete()
        assert kfs_check("upgrades", "0001")[0] == 0
        assert "Unapplying upgrades.0002_cutover_ledger... OK" in migrate("upgrades", "0001")
    finally:
        migrate_to_latest()


@pytest.mark.django_db(transaction=True)
def test_reversing_the_upgrade_jobs_is_refused_while_a_job_is_unfinished():
    from upgrades.models import UpgradeJob

    job = UpgradeJob.objects.create(
        tenant_id="guard-t", dataset_id="ds-1", idempotency_key="k-1", requested_by="u",
        owner="u", snapshot_at=timezone.now(),
    )  # fmt: skip
    try:
        for status in ("queued", "running", "succeeded"):
            UpgradeJob.objects.filter(id=job.id).update(status=status)
            code, text = kfs_check("upgrades", "zero")
            assert code == REFUSED_EXIT_STATUS, status
            assert "upgrades.0001_upgrade_jobs: upgrade_jobs_unfinished" in text
            assert f"[1: {job.id}]" in text
        assert "upgrade_jobs_unfinished" in refused_migrate("upgrades", "zero")
        assert UpgradeJob.objects.get(id=job.id).status == "succeeded"
        UpgradeJob.objects.filter(id=job.id).update(reconcile_completed_at=timezone.now())
        assert kfs_check("upgrades", "zero")[0] == 0
        assert "Unapplying upgrades.0001_upgrade_jobs... OK" in migrate("upgrades", "zero")
    finally:
        migrate_to_latest()


@pytest.mark.django_db(transaction=True)  # SQLite's schema editor refuses an open transaction
@pytest.mark.parametrize(
    ("app", "name", "guard"),
    [
        ("upgrades", "0004", "upgrades.0004_cleanup_completion"),
        ("upgrades", "0002", "upgrades.0002_cutover_ledger"),
        ("upgrades", "0001", "upgrades.0001_upgrade_jobs"),
        ("ingestion", "0007", "ingestion.0007_document_availability"),
    ],
)
def test_sqlmigrate_backwards_of_a_guarded_migration_refuses(app, name, guard):
    with pytest.raises(DowngradeRefused, match=f"{guard}: refused: .*sqlmigrate cannot do"):
        call_command("sqlmigrate", app, name, "--backwards", stdout=StringIO())
    out = StringIO()
    call_command("sqlmigrate", app, name, stdout=out)
    assert f"Refuse reversing {guard}" in out.getvalue()


def test_sqlmigrate_backwards_of_the_cleanup_completion_exits_3_in_a_real_process(tmp_path):
    env = dict(os.environ, KNOWLEDGE_VAR_DIR=str(tmp_path / "var"))
    run = subprocess.run(
        [sys.executable, "manage.py", "sqlmigrate", "--backwards", "upgrades", "0004"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == REFUSED_EXIT_STATUS, run.stderr
    assert "upgrades.0004_cleanup_completion: refused" in run.stderr
    assert "upgrade_cleanup_status_ck" not in run.stdout


@pytest.mark.django_db
def test_migrate_plan_of_a_refused_downgrade_prints_the_refusal_and_exits_3():
    from upgrades.models import UpgradeJob

    UpgradeJob.objects.create(
        tenant_id="guard-t", dataset_id="ds-1", idempotency_key="k-1", requested_by="u",
        owner="u", snapshot_at=timezone.now(),
    )  # fmt: skip
    history = applied()
    out = StringIO()
    with pytest.raises(DowngradeRefused, match="migrate upgrades zero would be refused"):
        call_command("migrate", "upgrades", "zero", "--plan", stdout=out)
    assert "Planned operations:" in out.getvalue()
    assert "refused: upgrades.0001_upgrade_jobs: upgrade_jobs_unfinished" in out.getvalue()
    assert applied() == history
    plan = StringIO()
    call_command("migrate", "upgrades", "0005", "--plan", stdout=plan)  # allowed: no refusal
    assert "refused" not in plan.getvalue()


@pytest.mark.django_db
def test_kfs_downgrade_check_names_an_unknown_database_in_one_line():
    with pytest.raises(CommandError, match=r"^--database 'nope' is not configured \(known: "):
        kfs_check("upgrades", "0001", "--database", "nope")
