"""Operator screens and commands of the staged run: the upgrade admin (read-only, not deletable,
retry action through the service) and ``kfs upgrade list|show|retry|sweep``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from knowledgefs.testing.upgrade_support import (
    INNER_KEY,
    deliver_all,
    inner,
    legacy_file,
    snapshot_body,
)
from upgrades.models import DocumentStatus, JobStatus, UpgradeDocument, UpgradeJob

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:upgrades_upgradejob_changelist"


@pytest.fixture(autouse=True)
def inner_key(settings):
    settings.DIFY_INNER_API_KEY = INNER_KEY


@pytest.fixture
def failed_job() -> UpgradeJob:
    """An upgrade whose one document was missing from the storage."""
    docs = [
        legacy_file("ok.txt", b"Leave is 25 days.\n", doc_id="ok"),
        legacy_file("gone.txt", None, doc_id="gone"),
    ]
    response = inner().post("/internal/dataset-upgrades", snapshot_body(docs), format="json")
    deliver_all()
    job = UpgradeJob.objects.get(id=response.json()["id"])
    assert (job.status, job.last_error_code) == ("failed", "documents_failed")
    return job


def test_the_job_list_and_page_show_stage_claim_checkpoints_and_leases(admin_client, failed_job):
    page = admin_client.get(reverse(CHANGELIST) + "?status__exact=failed")
    assert page.status_code == 200
    text = page.content.decode()
    assert "documents_failed" in text and "1/1/2" in text and "ds-1" in text
    assert "Retry failed upgrades" in text
    detail = admin_client.get(reverse("admin:upgrades_upgradejob_change", args=[failed_job.pk]))
    assert detail.status_code == 200
    text = detail.content.decode()
    assert "legacy_file_missing" in text and "gone.txt" in text  # documents inline
    assert "uf-" in text  # file leases inline
    assert 'name="_save"' not in text  # read-only
    delete = admin_client.get(reverse("admin:upgrades_upgradejob_delete", args=[failed_job.pk]))
    assert delete.status_code == 403
    assert admin_client.get(reverse("admin:upgrades_upgradejob_add")).status_code == 403


def test_the_retry_action_goes_through_the_service(admin_client, failed_job):
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "retry_failed_upgrades", "_selected_action": [str(failed_job.pk)]},
        follow=True,
    )
    assert "Queued 1 upgrade again." in response.content.decode()
    job = UpgradeJob.objects.get(id=failed_job.id)
    assert job.status == JobStatus.QUEUED and job.task_id  # dispatched through the claim
    assert UpgradeDocument.objects.get(job=job, legacy_document_id="gone").status == "pending"
    # Again: the job is active now and left unchanged.
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "retry_failed_upgrades", "_selected_action": [str(failed_job.pk)]},
        follow=True,
    )
    assert "is queued: left unchanged" in response.content.decode()


def test_kfs_upgrade_list_show_and_retry(failed_job):
    out = StringIO()
    call_command("kfs", "upgrade", "list", "--tenant", "tenant-a", "--json", stdout=out)
    listed = json.loads(out.getvalue())
    assert [(j["id"], j["status"]) for j in listed["items"]] == [(str(failed_job.id), "failed")]
    assert listed["next_cursor"] is None
    out = StringIO()
    call_command("kfs", "upgrade", "show", str(failed_job.id), stdout=out)
    text = out.getvalue()
    assert "failed" in text and "documents_failed" in text and "gone: legacy_file_missing" in text
    out = StringIO()
    call_command("kfs", "upgrade", "retry", str(failed_job.id), stdout=out)
    assert "queued again" in out.getvalue()
    assert UpgradeDocument.objects.get(job=failed_job, legacy_document_id="gone").status == (
        DocumentStatus.PENDING
    )
    out = StringIO()
    call_command("kfs", "upgrade", "sweep", "--json", stdout=out)
    assert "dispatched" in json.loads(out.getvalue())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {
                "KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS": "600",
                "KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS": "300",
            },
            "KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS=300 must be greater than "
            "KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS=600",
        ),
        ({"KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS": "5"}, "KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS"),
    ],
)
def test_startup_refuses_inconsistent_upgrade_settings(tmp_path, env, message):
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=root,
        env={**os.environ, "KNOWLEDGE_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and message in run.stderr, run.stderr[-500:]


def test_the_job_page_inlines_at_most_100_documents_those_needing_a_look_first(
    admin_client, failed_job
):
    from django.utils import timezone

    from upgrades.admin.jobs import INLINE_ROW_CAP

    now = timezone.now()
    UpgradeDocument.objects.bulk_create(
        [
            UpgradeDocument(
                job=failed_job,
                tenant_id="tenant-a",
                legacy_document_id=f"bulk-{n:03d}",
                name=f"bulk-{n:03d}.txt",
                data_source_type="upload_file",
                status=DocumentStatus.SUCCEEDED,
                state_reconciled_at=now,
            )
            for n in range(150)
        ]
    )
    UpgradeDocument.objects.filter(legacy_document_id="bulk-149").update(
        state_dead_lettered_at=now, state_reconcile_error="invalid_metadata: keys"
    )
    assert INLINE_ROW_CAP == 100
    detail = admin_client.get(reverse("admin:upgrades_upgradejob_change", args=[failed_job.pk]))
    assert detail.status_code == 200
    text = detail.content.decode()
    assert 'name="documents-TOTAL_FORMS" value="100"' in text
    assert text.count('class="form-row') <= 2 * INLINE_ROW_CAP  # documents + leases
    # The failed and the dead-lettered documents come first, ahead of 150 reconciled ones.
    assert "gone.txt" in text and "bulk-149.txt" in text and "bulk-148.txt" not in text
    link = reverse("admin:upgrades_upgradedocument_changelist") + f"?job={failed_job.pk}"
    assert f'href="{link}"' in text and "All 2 documents of this upgrade" in text
    listing = admin_client.get(link + "&status__exact=failed")
    assert listing.status_code == 200
    listed = listing.content.decode()
    assert "gone.txt" in listed and "bulk-001.txt" not in listed
    dead = admin_client.get(link + "&dead_lettered=yes").content.decode()
    assert "bulk-149.txt" in dead and "gone.txt" not in dead


def test_abandoning_a_failed_upgrade_lets_the_dataset_be_upgraded_again(admin_client, failed_job):
    url = f"/internal/dataset-upgrades/{failed_job.id}"
    again = inner().post(
        "/internal/dataset-upgrades", snapshot_body([], idempotency_key="k2"), format="json"
    )
    assert again.status_code == 409 and again.json()["code"] == "retry_required"
    response = inner().post(f"{url}/abandon", {"namespace_id": "tenant-a"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["last_error_code"]) == ("failed", "upgrade_abandoned")
    assert "after failing with documents_failed" in body["last_error_message"]
    assert set(failed_job.file_leases.values_list("status", flat=True)) == {"released"}
    retry = inner().post(f"{url}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert retry.status_code == 409 and retry.json()["code"] == "upgrade_abandoned"
    listing = inner().get("/internal/dataset-upgrades?namespace_id=tenant-a&dataset_id=ds-1")
    assert listing.json()["discovery"] == {"state": "can_upgrade", "upgrade_id": None}
    # The CLI and the admin action on an abandoned job change nothing more.
    out = StringIO()
    call_command("kfs", "upgrade", "abandon", str(failed_job.id), stdout=out)
    assert "already abandoned" in out.getvalue()
    admin_client.post(
        reverse(CHANGELIST),
        {"action": "abandon_failed_upgrades", "_selected_action": [str(failed_job.pk)]},
    )
    new = inner().post(
        "/internal/dataset-upgrades", snapshot_body([], idempotency_key="k2"), format="json"
    )
    assert new.status_code == 201 and new.json()["id"] != str(failed_job.id)
    # An active job cannot be abandoned; the admin action says so.
    page = admin_client.post(
        reverse(CHANGELIST),
        {"action": "abandon_failed_upgrades", "_selected_action": [new.json()["id"]]},
        follow=True,
    )
    assert "only a failed upgrade can be abandoned" in page.content.decode()
    cli = inner().post(
        f"/internal/dataset-upgrades/{new.json()['id']}/abandon",
        {"namespace_id": "tenant-a"},
        format="json",
    )
    assert cli.status_code == 409 and cli.json()["code"] == "upgrade_in_progress"


def test_the_admin_abandon_action_abandons_a_failed_upgrade(admin_client, failed_job):
    page = admin_client.post(
        reverse(CHANGELIST),
        {"action": "abandon_failed_upgrades", "_selected_action": [str(failed_job.pk)]},
        follow=True,
    )
    assert "Abandoned 1 upgrade(s)." in page.content.decode()
    assert UpgradeJob.objects.get(id=failed_job.id).last_error_code == "upgrade_abandoned"
