"""The snapshot route and the job-level services: idempotency, conflicts, validation, file
leases, retry, discovery (bridge specification §5.1 cases 1, 3, 4, 6, 7)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from knowledgefs.testing.upgrade_support import (
    INNER_KEY,
    inner,
    legacy_file,
    messages,
    snapshot_body,
)
from upgrades.models import (
    DocumentStatus,
    FileLeaseStatus,
    JobStatus,
    UpgradeDocument,
    UpgradeFileLease,
    UpgradeJob,
)
from upgrades.services import dispatch, snapshot

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/internal/dataset-upgrades"


@pytest.fixture(autouse=True)
def inner_key(settings):
    settings.DIFY_INNER_API_KEY = INNER_KEY


def _two_docs():
    shared = legacy_file("a.txt", b"alpha text\n", upload_file_id="uf-shared", doc_id="d-1")
    return [
        shared,
        {**shared, "id": "d-2", "name": "a copy.txt"},
        legacy_file("b.md", b"# Beta\n", doc_id="d-3", desired_enabled=False),
    ]


def test_snapshot_creates_the_job_documents_and_leases_then_dispatches_once():
    response = inner().post(URL, snapshot_body(_two_docs()), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["stage"], body["total_documents"]) == ("queued", "validating", 3)
    job = UpgradeJob.objects.get(id=body["id"])
    assert job.config_snapshot["name"] == "Handbook" and job.owner == "acct-2"
    assert job.app_binding_snapshot == [{"app_id": "app-1", "kind": "agent"}]
    docs = {d.legacy_document_id: d for d in job.documents.all()}
    assert docs["d-3"].desired_enabled is False and docs["d-1"].metadata_snapshot == {
        "author": "Ada"
    }
    leases = list(UpgradeFileLease.objects.filter(job=job))
    assert len(leases) == 2  # one per distinct upload file
    assert all(lease.expires_at > timezone.now() + timedelta(days=6) for lease in leases)
    # Claimed before it was published, and published exactly once: no remote work done.
    assert job.task_id and messages() == [((messages()[0][0]), (str(job.id), job.task_id))]
    assert job.space_id is None


def test_a_replay_returns_the_same_job_and_the_snapshot_never_changes():
    first = inner().post(URL, snapshot_body(_two_docs()), format="json").json()
    edited = snapshot_body(
        [legacy_file("renamed.txt", b"other\n", doc_id="d-1")],
        config={"name": "Renamed dataset"},
    )
    again = inner().post(URL, edited, format="json")
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    job = UpgradeJob.objects.get(id=first["id"])
    assert job.config_snapshot["name"] == "Handbook" and job.total_documents == 3
    assert UpgradeDocument.objects.get(job=job, legacy_document_id="d-1").name == "a.txt"
    assert len(messages()) == 1  # the replay dispatched nothing


def test_the_same_key_for_another_dataset_is_a_conflict():
    inner().post(URL, snapshot_body(_two_docs()), format="json")
    response = inner().post(URL, snapshot_body([], dataset_id="ds-2"), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_key_reused"


def test_a_second_active_upgrade_of_the_dataset_is_refused():
    first = inner().post(URL, snapshot_body([]), format="json").json()
    response = inner().post(URL, snapshot_body([], idempotency_key="click-2"), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "upgrade_in_progress"
    assert response.json()["details"]["upgrade_id"] == first["id"]


def test_the_partial_unique_index_is_the_last_line(monkeypatch):
    """Two racing snapshots pass the check; the index refuses the second with the same 409."""
    inner().post(URL, snapshot_body([]), format="json")
    monkeypatch.setattr(snapshot, "_existing_for_dataset", lambda tenant, data: None)
    response = inner().post(URL, snapshot_body([], idempotency_key="click-2"), format="json")
    assert response.status_code == 409 and response.json()["code"] == "upgrade_in_progress"
    with pytest.raises(IntegrityError), transaction.atomic():
        UpgradeJob.objects.create(
            tenant_id="tenant-a",
            dataset_id="ds-1",
            idempotency_key="raw",
            requested_by="a",
            owner="a",
            snapshot_at=timezone.now(),
        )


@pytest.mark.parametrize("then", [JobStatus.QUEUED, JobStatus.FAILED, JobStatus.SUCCEEDED])
def test_a_replay_racing_its_original_gets_the_same_job_not_a_conflict(monkeypatch, then):
    """The replay misses the key, then the original commits before the Dataset check: the
    Dataset check finds the original's job (active, failed or succeeded), whose key is this
    request's, so 200 with it instead of 409."""
    check = snapshot._check_documents
    original = []

    def original_commits_meanwhile(documents, tenant):
        check(documents, tenant)
        if not original:
            original.append(None)  # the nested request (the original) passes straight on
            original[0] = inner().post(URL, snapshot_body([]), format="json")
            UpgradeJob.objects.update(status=then, task_id=None)

    monkeypatch.setattr(snapshot, "_check_documents", original_commits_meanwhile)
    replay = inner().post(URL, snapshot_body([]), format="json")
    assert original[0].status_code == 201
    assert replay.status_code == 200, replay.content
    assert replay.json()["id"] == original[0].json()["id"]
    assert UpgradeJob.objects.count() == 1


def test_a_failed_or_succeeded_dataset_is_not_upgraded_again():
    job_id = inner().post(URL, snapshot_body([]), format="json").json()["id"]
    UpgradeJob.objects.filter(id=job_id).update(status=JobStatus.FAILED, task_id=None)
    again = inner().post(URL, snapshot_body([], idempotency_key="k2"), format="json")
    assert again.status_code == 409 and again.json()["code"] == "retry_required"
    UpgradeJob.objects.filter(id=job_id).update(status=JobStatus.SUCCEEDED)
    again = inner().post(URL, snapshot_body([], idempotency_key="k3"), format="json")
    assert again.status_code == 409 and again.json()["code"] == "already_upgraded"


def test_unsupported_source_types_are_refused_naming_the_documents():
    notion = {**legacy_file("n", b"x"), "id": "notion-7", "data_source_type": "notion_import"}
    response = inner().post(URL, snapshot_body([notion, _two_docs()[0]]), format="json")
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "unsupported_data_source"
    assert body["details"] == {"documents": ["notion-7"], "data_source_types": ["notion_import"]}
    assert not UpgradeJob.objects.exists()


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"documents": [{"id": "x"}] * 5001}, "documents", "5001 entries; the limit is 5000"),
        ({"idempotency_key": "k" * 256}, "idempotency_key", "255"),
        ({"config": {"description": "no name"}}, "config", "name"),
        ({"app_bindings": [{"app_id": "a", "kind": "chat"}]}, "app_bindings", "chat"),
    ],
)
def test_invalid_snapshots_name_the_field_and_the_limit(change, field, fragment):
    body = {**snapshot_body([]), **change}
    response = inner().post(URL, body, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_request" and field in body["message"]
    assert fragment in str(body["details"]), body
    assert not UpgradeJob.objects.exists()


def test_document_metadata_and_ids_are_bounded():
    doc = legacy_file("a.txt", b"a", metadata={f"k{i}": i for i in range(101)})
    response = inner().post(URL, snapshot_body([doc]), format="json")
    assert response.status_code == 400 and "101 keys; the limit is 100" in str(response.json())
    doc = legacy_file("a.txt", b"a", doc_id="same")
    response = inner().post(URL, snapshot_body([doc, doc]), format="json")
    assert response.status_code == 400 and "repeated: same" in response.json()["message"]


def test_routes_need_the_inner_key_and_hide_other_tenants():
    job_id = inner().post(URL, snapshot_body([]), format="json").json()["id"]
    from rest_framework.test import APIClient

    assert APIClient().post(URL, snapshot_body([]), format="json").status_code in (401, 403)
    mine = inner().get(f"{URL}/{job_id}?namespace_id=tenant-a")
    assert mine.status_code == 200 and mine.json()["stage"] == "validating"
    other = inner().get(f"{URL}/{job_id}?namespace_id=tenant-b")
    assert other.status_code == 404 and other.json()["code"] == "upgrade_not_found"
    retry = inner().post(f"{URL}/{job_id}/retry", {"namespace_id": "tenant-b"}, format="json")
    assert retry.status_code == 404  # case 4: another dataset's/tenant's job is not found
    listing = inner().get(f"{URL}?namespace_id=tenant-a&dataset_id=ds-1").json()
    assert [j["id"] for j in listing["results"]] == [job_id]
    assert listing["discovery"] == {"state": "upgrade_in_progress", "upgrade_id": job_id}
    assert inner().get(f"{URL}?namespace_id=tenant-a&dataset_id=ds-9").json()["discovery"] == {
        "state": "can_upgrade",
        "upgrade_id": None,
    }


# --- claims (case 7) -----------------------------------------------------------------------------


def _queued_job() -> UpgradeJob:
    job_id = inner().post(URL, snapshot_body([]), format="json").json()["id"]
    dispatch.release_claim(job_id, UpgradeJob.objects.get(id=job_id).task_id)
    return UpgradeJob.objects.get(id=job_id)


def test_a_claim_is_refused_while_one_exists_or_the_job_is_not_queued():
    job = _queued_job()
    first = dispatch.dispatch(job.id)
    assert first and dispatch.dispatch(job.id) is None
    UpgradeJob.objects.filter(id=job.id).update(status=JobStatus.FAILED, task_id=None)
    assert dispatch.dispatch(job.id) is None


def test_releasing_with_a_foreign_task_id_changes_nothing():
    job = _queued_job()
    ours = dispatch.dispatch(job.id)
    assert dispatch.release_claim(job.id, "someone-else") is False
    assert UpgradeJob.objects.get(id=job.id).task_id == ours


class RefusingBroker:
    """A django-q2 broker whose every publish fails (``KNOWLEDGE_UPGRADE_BROKER_CLASS``)."""

    def enqueue(self, task):
        raise ConnectionError("broker unreachable")


def test_a_failed_publish_leaves_the_job_queued_without_a_claim(settings):
    job = _queued_job()
    before = messages()
    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = "upgrades.tests.test_upgrade_snapshot.RefusingBroker"
    assert dispatch.dispatch(job.id) is None
    job.refresh_from_db()
    assert (job.status, job.task_id, job.claimed_at) == ("queued", None, None)
    assert messages() == before


# --- retry (case 6) ------------------------------------------------------------------------------


def test_retry_rearms_failed_documents_and_expired_unreleased_leases():
    job_id = inner().post(URL, snapshot_body(_two_docs()), format="json").json()["id"]
    past = timezone.now() - timedelta(days=1)
    UpgradeJob.objects.filter(id=job_id).update(
        status=JobStatus.FAILED, task_id=None, last_error_code="documents_failed"
    )
    UpgradeDocument.objects.filter(job_id=job_id, legacy_document_id="d-3").update(
        status=DocumentStatus.FAILED, last_error_code="legacy_file_missing"
    )
    UpgradeDocument.objects.filter(job_id=job_id, legacy_document_id="d-1").update(
        status=DocumentStatus.SUCCEEDED
    )
    UpgradeFileLease.objects.filter(job_id=job_id).update(
        status=FileLeaseStatus.EXPIRED, expires_at=past
    )
    released = UpgradeFileLease.objects.filter(job_id=job_id).first()
    UpgradeFileLease.objects.filter(id=released.id).update(
        status=FileLeaseStatus.RELEASED, released_at=past
    )
    response = inner().post(f"{URL}/{job_id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert response.status_code == 202, response.content
    job = UpgradeJob.objects.get(id=job_id)
    assert (job.status, job.last_error_code, job.completed_at) == ("queued", None, None)
    assert job.task_id  # dispatched through the claim after the commit
    statuses = dict(job.documents.values_list("legacy_document_id", "status"))
    assert statuses == {"d-1": "succeeded", "d-2": "pending", "d-3": "pending"}
    leases = {lease.id: lease for lease in UpgradeFileLease.objects.filter(job_id=job_id)}
    assert leases[released.id].status == "released"
    others = [lease for lid, lease in leases.items() if lid != released.id]
    assert [lease.status for lease in others] == ["active"]
    assert others[0].expires_at > timezone.now() + timedelta(days=6)


def test_retry_returns_active_jobs_unchanged_and_refuses_succeeded_ones():
    job_id = inner().post(URL, snapshot_body([]), format="json").json()["id"]
    before = UpgradeJob.objects.get(id=job_id)
    same = inner().post(f"{URL}/{job_id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert same.status_code == 200
    after = UpgradeJob.objects.get(id=job_id)
    assert (after.task_id, after.updated_at) == (before.task_id, before.updated_at)
    UpgradeJob.objects.filter(id=job_id).update(status=JobStatus.SUCCEEDED, task_id=None)
    refused = inner().post(f"{URL}/{job_id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert refused.status_code == 409
    assert refused.json()["code"] == "upgrade_already_succeeded"


# --- file leases ---------------------------------------------------------------------------


def test_dify_asks_before_deleting_legacy_bytes():
    inner().post(URL, snapshot_body(_two_docs()), format="json")
    leased = inner().get("/internal/upgrade-file-leases/uf-shared?namespace_id=tenant-a").json()
    assert leased["leased"] is True and leased["expires_at"]
    lease = UpgradeFileLease.objects.get(upload_file_id="uf-shared")
    assert lease.cleanup_requested_at is not None
    other_tenant = inner().get("/internal/upgrade-file-leases/uf-shared?namespace_id=tenant-b")
    assert other_tenant.json() == {
        "upload_file_id": "uf-shared",
        "leased": False,
        "expires_at": None,
    }
    UpgradeFileLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = inner().get("/internal/upgrade-file-leases/uf-shared?namespace_id=tenant-a").json()
    assert expired["leased"] is False


@pytest.mark.parametrize(
    "key",
    [
        "/etc/passwd",
        "../../../../etc/hostname",
        "upload_files/tenant-a/../../x",
        "upload_files/tenant-a//x",
        "upload_files\\tenant-a\\x",
        "upload_files/tenant-a/x\nrm",
        "upload_files/tenant-b/secret-b",
        "upload_files/tenant-a",
    ],
)
def test_storage_keys_that_leave_the_tenants_uploads_are_refused(key):
    docs = [legacy_file("ok.txt", b"fine\n", doc_id="ok"), legacy_file("x.txt", None, doc_id="bad")]
    docs[1]["storage_key"] = key
    response = inner().post(URL, snapshot_body(docs), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_storage_key"
    assert body["details"] == {"document": "bad", "field": "documents.1.storage_key"}
    assert "document bad" in body["message"]
    assert not UpgradeJob.objects.exists()


def test_keys_outside_difys_upload_layout_are_accepted():
    doc = legacy_file("ok.txt", b"fine\n", storage_key="other-area/tenant-a/f.txt")
    assert inner().post(URL, snapshot_body([doc]), format="json").status_code == 201


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_metadata_reconciliation_would_refuse_is_refused_at_snapshot(key):
    docs = [
        legacy_file("ok.txt", b"fine\n", doc_id="ok"),
        legacy_file("m.txt", b"meta\n", doc_id="meta", metadata={"author": "Ada", key: "v"}),
    ]
    response = inner().post(URL, snapshot_body(docs), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_metadata"
    assert body["details"] == {"document": "meta", "field": "documents.1.metadata", "key": key}
    assert "non-empty strings of at most 255 characters" in body["message"]
    assert not UpgradeJob.objects.exists()
