"""The staged run: one step per delivery, fenced checkpoints, re-dispatch through the claim, the
sweep (G1/G2), fenced failure (G3), time-bounded space wait (G5), and the whole run end to end
from the HTTP snapshot to documents published in the new space (bridge specification §5.2)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone
from django_q.models import OrmQ

from ingestion.compilation.recovery import drain_queued
from ingestion.models import CompilationJob, Document
from knowledgefs.testing.upgrade_support import (
    INNER_KEY,
    RECONCILE_FUNC,
    deliver_all,
    inner,
    legacy_file,
    messages,
    snapshot_body,
)
from spaces.models import SpaceProfile
from upgrades.models import (
    DocumentStatus,
    FileLeaseStatus,
    JobStage,
    JobStatus,
    UpgradeDocument,
    UpgradeFileLease,
    UpgradeJob,
)
from upgrades.services import dispatch
from upgrades.tasks import run_upgrade_step, sweep_upgrades

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/internal/dataset-upgrades"
DOCS = Path(__file__).resolve().parents[2] / "docs"
TEXT_A = b"Annual leave is twenty five days per year for every employee.\n"
TEXT_B = b"# Expenses\n\nReceipts are due within thirty days of purchase.\n"


@pytest.fixture(autouse=True)
def inner_key(settings):
    settings.DIFY_INNER_API_KEY = INNER_KEY


def start(documents: list[dict], **overrides) -> UpgradeJob:
    response = inner().post(URL, snapshot_body(documents, **overrides), format="json")
    assert response.status_code == 201, response.content
    return UpgradeJob.objects.get(id=response.json()["id"])


def step() -> str:
    """Deliver the single waiting step message."""
    waiting = messages()
    assert len(waiting) == 1, waiting
    message_id, args = waiting[0]
    OrmQ.objects.filter(id=message_id).delete()
    return run_upgrade_step(*args)


def reload(job: UpgradeJob) -> UpgradeJob:
    return UpgradeJob.objects.get(id=job.id)


# --- one step per delivery (cases 8, 14) --------------------------------------------------------


def test_each_delivery_runs_exactly_one_stage_and_hands_the_job_back_through_the_claim():
    job = start([legacy_file("a.txt", TEXT_A, doc_id="d-1")])
    trail = []
    while messages():
        before = reload(job)
        result = step()
        after = reload(job)
        trail.append((before.stage, result, after.stage))
        if after.status == JobStatus.QUEUED:
            # checkpoint committed as queued without a claim, then dispatched through a new claim
            assert after.task_id and after.task_id != before.task_id
            assert messages() == [(messages()[0][0], (str(job.id), after.task_id))]
            assert after.attempt_count == 0
    assert trail == [
        ("validating", "space_created", "waiting_for_space"),
        ("waiting_for_space", "space_ready", "submitting_documents"),
        ("submitting_documents", "document_submitted", "submitting_documents"),
        ("submitting_documents", "documents_done", "migrating_access"),
        ("migrating_access", "access_migrated", "finalizing"),
        ("finalizing", "succeeded", "completed"),
    ]
    job = reload(job)
    assert (job.status, job.completed_documents, job.failed_documents) == ("succeeded", 1, 0)
    assert job.space.slug == f"upgrade-{job.id.hex}" and job.space.name == "Handbook"
    assert job.space.description == "HR handbook"
    assert job.resolved_configuration["embedding"]["reason"] == "local_runtime_default_profile"
    access = job.resolved_configuration["access"]
    assert access["applied"] is False and access["visibility"] == "only_me"
    assert access["members"] == ["acct-3"] and access["enable_api"] is True
    assert access["app_bindings"] == [{"app_id": "app-1", "kind": "agent"}]
    assert access["tag_ids"] == ["tag-1"]


def test_success_and_the_first_reconciliation_lease_commit_together_then_publish(settings):
    job = start([legacy_file("a.txt", TEXT_A)])
    deliver_all()
    job = reload(job)
    assert (job.status, job.stage, job.task_id) == ("succeeded", "completed", None)
    assert job.completed_at and job.reconcile_lease_token and job.reconcile_dispatched_at
    lease = (job.reconcile_lease_expires_at - job.reconcile_dispatched_at).total_seconds()
    assert lease == settings.KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS
    assert job.reconcile_attempt_count == 1 and job.reconcile_completed_at is None
    assert [args for _, args in messages(RECONCILE_FUNC)] == [
        (str(job.id), str(job.reconcile_lease_token))
    ]
    assert messages() == []  # no bare follow-up step (case 15)


def test_a_failed_reconcile_publish_keeps_the_success_and_the_lease(settings):
    job = start([legacy_file("a.txt", TEXT_A)])
    while reload(job).stage != JobStage.FINALIZING:
        step()
    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = "upgrades.tests.test_upgrade_snapshot.RefusingBroker"
    message_id, args = messages()[0]
    OrmQ.objects.filter(id=message_id).delete()
    assert run_upgrade_step(*args) == "succeeded"
    job = reload(job)
    assert job.status == "succeeded" and job.reconcile_lease_token is not None
    assert messages(RECONCILE_FUNC) == []


def test_a_job_without_documents_succeeds_with_nothing_to_reconcile():
    job = start([])
    assert deliver_all()[-1] == "succeeded"
    job = reload(job)
    assert job.status == "succeeded" and job.reconcile_completed_at is not None
    assert job.reconcile_lease_token is None and messages(RECONCILE_FUNC) == []


# --- delivery start, fencing (cases 9, 16, G3) ---------------------------------------------------


def test_a_delivery_counts_its_attempt_and_extends_the_file_leases():
    job = start([legacy_file("a.txt", TEXT_A)])
    UpgradeFileLease.objects.update(
        status=FileLeaseStatus.EXPIRED, expires_at=timezone.now() + timedelta(hours=1)
    )
    running = dispatch.begin(job.id, reload(job).task_id)
    assert running.status == "running" and running.attempt_count == 1
    lease = UpgradeFileLease.objects.get(job=job)
    assert lease.status == "active" and lease.expires_at > timezone.now() + timedelta(days=6)


def test_duplicate_and_stale_deliveries_change_nothing():
    job = start([legacy_file("a.txt", TEXT_A)])
    (_, (job_id, task_id)) = messages()[0]
    assert run_upgrade_step(job_id, task_id) == "space_created"
    snapshot = reload(job)
    # The same message again (a broker redelivery), a made-up id, a malformed job id.
    assert run_upgrade_step(job_id, task_id) == "stale"
    assert run_upgrade_step(job_id, uuid.uuid4().hex) == "stale"
    assert run_upgrade_step("not-a-uuid", task_id) == "stale"
    after = reload(job)
    assert (after.updated_at, after.task_id, after.stage) == (
        snapshot.updated_at,
        snapshot.task_id,
        snapshot.stage,
    )
    # A terminal job never runs.
    UpgradeJob.objects.filter(id=job.id).update(status=JobStatus.FAILED)
    assert run_upgrade_step(job_id, after.task_id) == "stale"


def test_a_stale_worker_cannot_fail_or_checkpoint_the_job():
    job = start([legacy_file("a.txt", TEXT_A)])
    old = reload(job).task_id
    dispatch.begin(job.id, old)
    # The step outlived the limit: the sweep takes it back under a new claim.
    report = dispatch.sweep(now=timezone.now() + timedelta(days=2))
    assert report.stale_requeued == 1 and report.dispatched == 1
    new = reload(job).task_id
    assert new != old
    assert dispatch.fail(job.id, old, "internal_error", "late") is False
    with pytest.raises(dispatch.ClaimLost), transaction.atomic():
        dispatch.checkpoint(job.id, old, stage=JobStage.FINALIZING)
    job = reload(job)
    assert (job.status, job.stage, job.task_id, job.last_error_code) == (
        "queued",
        "validating",
        new,
        None,
    )
    # The original message arriving late is refused; the new one runs.
    assert run_upgrade_step(str(job.id), old) == "stale"
    assert run_upgrade_step(str(job.id), new) == "space_created"


def test_an_ordinary_step_error_fails_the_job_with_its_code(settings):
    job = start([legacy_file("a.txt", TEXT_A)])
    step()  # validating
    SpaceProfile.objects.filter(space_id=reload(job).space_id).update(state="validation-failed")
    assert step() == "failed"
    job = reload(job)
    assert (job.status, job.last_error_code) == ("failed", "space_validation_failed")
    assert "failed its profile validation" in job.last_error_message
    assert job.completed_at is not None and job.task_id is None


# --- waiting for the space (cases 10, 16, G5) -----------------------------------------------------


def test_a_space_not_ready_waits_by_time_then_fails_with_a_clear_code(settings):
    settings.KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS = 600
    job = start([legacy_file("a.txt", TEXT_A)])
    step()
    SpaceProfile.objects.filter(space_id=reload(job).space_id).update(state="setup-required")
    assert step() == "space_waiting"
    waiting = reload(job)
    assert (waiting.status, waiting.task_id, waiting.stage) == ("queued", None, "waiting_for_space")
    assert waiting.not_ready_since is not None and waiting.next_step_at > timezone.now()
    assert messages() == []  # the countdown is the sweep's, not a bare re-publish
    assert dispatch.dispatch(job.id) is None  # not due yet
    # Due: the sweep dispatches it; still not ready but within the wait.
    assert dispatch.sweep(now=waiting.next_step_at + timedelta(seconds=1)).dispatched == 1
    assert step() == "space_waiting"
    assert reload(job).not_ready_since == waiting.not_ready_since
    # Past the deadline (by time, not by counting retries): failed.
    UpgradeJob.objects.filter(id=job.id).update(
        not_ready_since=timezone.now() - timedelta(seconds=601), next_step_at=None
    )
    dispatch.sweep(now=timezone.now() + timedelta(seconds=10))
    assert step() == "failed"
    job = reload(job)
    assert job.last_error_code == "space_not_ready"
    assert "KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS=600" in job.last_error_message


def test_a_missing_space_fails_the_wait():
    job = start([])
    step()
    UpgradeJob.objects.filter(id=job.id).update(space=None)
    assert step() == "failed"
    assert reload(job).last_error_code == "space_missing"


# --- documents (case 12) --------------------------------------------------------------------------


def test_document_failures_are_recorded_and_the_job_fails_documents_failed():
    docs = [
        legacy_file("good.txt", TEXT_A, doc_id="good"),
        legacy_file("gone.txt", None, doc_id="gone"),  # never put into the storage
        legacy_file("blob.bin", b"\x00\x01\x02\x03" * 20, doc_id="binary"),
    ]
    job = start(docs)
    results = deliver_all()
    assert results.count("document_failed") == 2 and results[-1] == "documents_failed"
    job = reload(job)
    assert (job.status, job.last_error_code) == ("failed", "documents_failed")
    assert (job.completed_documents, job.failed_documents) == (1, 2)
    rows = {d.legacy_document_id: d for d in UpgradeDocument.objects.filter(job=job)}
    assert rows["gone"].last_error_code == "legacy_file_missing"
    assert rows["binary"].last_error_code == "unsupported_media_type"
    assert rows["good"].status == "succeeded" and rows["good"].document_id
    body = inner().get(f"{URL}/{job.id}?namespace_id=tenant-a").json()
    assert {e["legacy_document_id"] for e in body["errors"]} == {"gone", "binary"}
    # The operator fixes the missing file and removes nothing else; retry re-runs only the
    # failed documents through the claim, and the job fails again only for the binary one.
    from knowledgefs import storage

    storage.put_object(rows["gone"].source_key, TEXT_B)
    retry = inner().post(f"{URL}/{job.id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert retry.status_code == 202 and retry.json()["stage"] == "submitting_documents"
    deliver_all()
    job = reload(job)
    assert (job.completed_documents, job.failed_documents) == (2, 1)
    assert Document.objects.filter(space=job.space).count() == 2


def test_a_shared_file_keeps_its_lease_until_the_last_document_is_handed_off():
    first = legacy_file("a.txt", TEXT_A, upload_file_id="uf-1", doc_id="d-1")
    job = start([first, {**first, "id": "d-2", "name": "b.txt"}])
    lease = UpgradeFileLease.objects.get(job=job)
    step(), step()
    assert step() == "document_submitted"
    lease.refresh_from_db()
    assert lease.status == "active"
    assert step() == "document_submitted"
    lease.refresh_from_db()
    assert lease.status == "released" and lease.released_at is not None
    # Same bytes: both legacy documents link to one new document, and that is recorded.
    rows = list(UpgradeDocument.objects.filter(job=job).order_by("id"))
    assert rows[0].document_id == rows[1].document_id
    assert reload(job).resolved_configuration["deduplicated_documents"] == [
        {"legacy_document_id": "d-2", "document_id": str(rows[0].document_id)}
    ]


def test_a_processing_document_is_picked_again_after_a_crash():
    job = start([legacy_file("a.txt", TEXT_A, doc_id="d-1")])
    step(), step()
    # A worker admitted the file, then died before its checkpoint.
    from ingestion.documents import admit_document

    admit_document(reload(job).space, filename="a.txt", data=TEXT_A)
    UpgradeDocument.objects.filter(job=job).update(status=DocumentStatus.PROCESSING)
    assert step() == "document_submitted"
    row = UpgradeDocument.objects.get(job=job)
    assert row.status == "succeeded"
    assert Document.objects.filter(space=reload(job).space).count() == 1


# --- the sweep (G1, G2, attempts) -----------------------------------------------------------------


def test_a_claim_never_delivered_is_recovered_and_the_late_original_is_refused(settings):
    job = start([legacy_file("a.txt", TEXT_A)])
    (message_id, (job_id, original)) = messages()[0]
    OrmQ.objects.filter(id=message_id).delete()  # the dispatcher died / the broker lost it
    assert dispatch.sweep().undelivered_reclaimed == 0  # within the grace: left alone
    later = timezone.now() + timedelta(seconds=settings.KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS)
    report = dispatch.sweep(now=later + timedelta(seconds=1))
    assert (report.undelivered_reclaimed, report.dispatched) == (1, 1)
    fresh = reload(job).task_id
    assert fresh != original and messages()[0][1] == (job_id, fresh)
    assert run_upgrade_step(job_id, original) == "stale"
    assert step() == "space_created"


def test_a_step_started_too_often_is_dead_lettered(settings):
    settings.KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS = 2
    job = start([legacy_file("a.txt", TEXT_A)])
    far = timezone.now() + timedelta(days=2)
    OrmQ.objects.all().delete()
    dispatch.begin(job.id, reload(job).task_id)  # the worker dies in the step
    assert dispatch.sweep(now=far).stale_requeued == 1
    OrmQ.objects.all().delete()
    dispatch.begin(job.id, reload(job).task_id)
    assert dispatch.sweep(now=far).attempts_exhausted == 1
    job = reload(job)
    assert (job.status, job.last_error_code) == ("failed", "attempts_exhausted")
    assert "validating step was started 2 times" in job.last_error_message


def test_the_sweep_schedule_exists_and_the_task_runs():
    dispatch.ensure_sweep_schedule()
    from django_q.models import Schedule

    schedule = Schedule.objects.get(name=dispatch.SWEEP_SCHEDULE)
    assert (schedule.func, schedule.minutes) == ("upgrades.tasks.sweep_upgrades", 1)
    assert set(sweep_upgrades()) == {
        "undelivered_reclaimed",
        "stale_requeued",
        "attempts_exhausted",
        "dispatched",
    }


# --- end to end ---------------------------------------------------------------------------------


def test_three_real_documents_upgrade_compile_and_publish_in_the_new_space():
    files = ["architecture.md", "configuration.md", "testing.md"]
    docs = [legacy_file(name, (DOCS / name).read_bytes(), doc_id=name) for name in files]
    response = inner().post(URL, snapshot_body(docs), format="json")
    assert response.status_code == 201
    job_id = response.json()["id"]
    results = deliver_all()
    assert results.count("document_submitted") == 3 and results[-1] == "succeeded"
    job = inner().get(f"{URL}/{job_id}?namespace_id=tenant-a").json()
    assert (job["status"], job["stage"], job["completed_documents"]) == (
        "succeeded",
        "completed",
        3,
    )
    space_id = job["space_id"]
    drain_queued(uuid.UUID(space_id))
    published = Document.objects.filter(space_id=space_id, active_generation__isnull=False)
    assert sorted(published.values_list("filename", flat=True)) == sorted(files)
    for row in UpgradeDocument.objects.filter(job_id=job_id):
        assert CompilationJob.objects.get(id=row.compilation_job_id).document_id == row.document_id
        assert row.document.metadata == {"author": "Ada"}
    assert not UpgradeFileLease.objects.filter(job_id=job_id, status="active").exists()


def test_an_upgraded_space_can_be_deleted_but_not_during_its_upgrade(principal):
    from knowledgefs.errors import Conflict
    from spaces.services import delete_space

    job = start([legacy_file("a.txt", TEXT_A)])
    step()  # validating: the space exists, the upgrade is still queued
    with pytest.raises(Conflict) as refused:
        delete_space(principal, reload(job).space_id)
    assert refused.value.code == "space_upgrade_in_progress"
    deliver_all()
    delete_space(principal, reload(job).space_id)
    job = reload(job)
    assert job.status == "succeeded" and job.space_id is None
    assert job.resolved_configuration["space_slug"] == f"upgrade-{job.id.hex}"


def test_a_failed_publish_after_a_checkpoint_leaves_it_to_the_sweep(settings):
    job = start([legacy_file("a.txt", TEXT_A)])
    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = "upgrades.tests.test_upgrade_snapshot.RefusingBroker"
    assert step() == "space_created"
    job = reload(job)
    assert (job.status, job.stage, job.task_id) == ("queued", "waiting_for_space", None)
    assert messages() == []
    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = ""
    assert dispatch.sweep(now=timezone.now() + timedelta(seconds=10)).dispatched == 1
    assert deliver_all()[-1] == "succeeded"


def test_two_concurrent_sweeps_dispatch_a_lost_claim_exactly_once(settings):
    import threading

    from django.db import connections

    job = start([legacy_file("a.txt", TEXT_A)])
    OrmQ.objects.all().delete()  # the message was lost
    far = timezone.now() + timedelta(days=1)
    reports, errors = [], []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        try:
            barrier.wait()
            reports.append(dispatch.sweep(now=far))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(r.dispatched for r in reports) == 1
    assert [args for _, args in messages()] == [(str(job.id), reload(job).task_id)]


# --- one unreadable legacy file fails only its document (per-object storage failures) -----------


def test_a_directory_at_a_storage_key_fails_only_that_document(object_storage):
    docs = [
        legacy_file("good.txt", TEXT_A, doc_id="good"),
        legacy_file("adir.txt", None, doc_id="adir", storage_key="upload_files/tenant-a/adir"),
        legacy_file("after.md", TEXT_B, doc_id="after"),
    ]
    (object_storage / "upload_files/tenant-a/adir").mkdir(parents=True)
    job = start(docs)
    results = deliver_all()
    assert results.count("document_failed") == 1 and results[-1] == "documents_failed"
    rows = {d.legacy_document_id: d for d in UpgradeDocument.objects.filter(job=job)}
    assert rows["adir"].status == "failed"
    assert rows["adir"].last_error_code == "legacy_file_unreadable"
    assert "document adir" in rows["adir"].last_error_message
    assert "IsADirectoryError" in rows["adir"].last_error_message
    assert rows["good"].status == rows["after"].status == "succeeded"  # the run went on
    assert reload(job).last_error_code == "documents_failed"


def test_a_key_the_storage_refuses_as_suspicious_fails_only_that_document():
    job = start([legacy_file("good.txt", TEXT_A, doc_id="good")])
    # A row written before keys were checked at snapshot time: the storage refuses the path.
    UpgradeDocument.objects.create(
        job=job,
        tenant_id=job.tenant_id,
        legacy_document_id="escape",
        name="escape.txt",
        data_source_type="upload_file",
        upload_file_id="uf-escape",
        source_key="../../../../etc/hostname",
        desired_enabled=True,
        metadata_snapshot={},
    )
    UpgradeJob.objects.filter(id=job.id).update(total_documents=2)
    results = deliver_all()
    assert results[-1] == "documents_failed"
    rows = {d.legacy_document_id: d for d in UpgradeDocument.objects.filter(job=job)}
    assert rows["escape"].last_error_code == "legacy_file_unreadable"
    assert "SuspiciousFileOperation" in rows["escape"].last_error_message
    assert rows["good"].status == "succeeded"


# --- a retry after the space was deleted restarts from validating --------------------------------


def test_a_retry_after_the_space_was_deleted_restarts_into_a_replacement_space():
    from knowledgefs.auth.principal import Principal
    from spaces.services import delete_space

    docs = [
        legacy_file("good.txt", TEXT_A, doc_id="good"),
        legacy_file("gone.txt", None, doc_id="gone"),
    ]
    job = start(docs)
    assert deliver_all()[-1] == "documents_failed"
    first_space = reload(job).space_id
    delete_space(Principal(tenant_id="tenant-a", kind="internal"), first_space)
    from knowledgefs import storage

    storage.put_object(docs[1]["storage_key"], TEXT_B)
    retry = inner().post(f"{URL}/{job.id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert retry.status_code == 202, retry.content
    job = reload(job)
    assert (job.status, job.stage, job.space_id) == ("queued", "validating", None)
    assert set(job.documents.values_list("status", flat=True)) == {"pending"}
    assert deliver_all()[-1] == "succeeded"
    job = reload(job)
    assert job.space_id != first_space
    assert job.space.slug.startswith(f"upgrade-{job.id.hex}") and job.space.deleting_at is None
    assert (job.completed_documents, job.failed_documents) == (2, 0)
    names = Document.objects.filter(space_id=job.space_id).values_list("filename", flat=True)
    assert sorted(names) == ["gone.txt", "good.txt"]


def test_a_space_still_being_deleted_gets_a_replacement_with_the_next_slug():
    from spaces.models import KnowledgeSpace

    job = start([legacy_file("good.txt", TEXT_A, doc_id="good")])
    step()  # validating: the space exists
    first = reload(job).space_id
    KnowledgeSpace.objects.filter(id=first).update(deleting_at=timezone.now())
    assert step() == "failed" and reload(job).last_error_code == "space_missing"
    retry = inner().post(f"{URL}/{job.id}/retry", {"namespace_id": "tenant-a"}, format="json")
    assert retry.status_code == 202
    assert deliver_all()[-1] == "succeeded"
    job = reload(job)
    assert job.space_id != first and job.space.slug == f"upgrade-{job.id.hex}-2"
    assert job.documents.get().status == "succeeded"
