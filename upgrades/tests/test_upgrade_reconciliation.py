"""Document reconciliation after an upgrade: the reconciler, the delivery lease (fencing, rotation,
duplicates), recovery, dead letters, and the retrieval gate (upgrade spec §5.3 cases 17-25, §5.4
case 27, gap G4)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import django_q.tasks
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from ingestion.models import Document
from knowledgefs.testing.upgrade_factories import Legacy, SteppingClock, succeeded_job
from upgrades.models import JobStatus, UpgradeDocument, UpgradeJob
from upgrades.services import reconciliation_gate, reconciliation_ledger
from upgrades.services import reconciliation_runner as rec

pytestmark = pytest.mark.django_db

TTL = timedelta(seconds=300)


def _published() -> list[tuple[str, str]]:
    """``(job id, token)`` of every reconcile delivery on the ORM queue, oldest first."""
    out = []
    for message in OrmQ.objects.order_by("id"):
        task = message.task
        if task.get("func") == rec.TASK_FUNCTION:
            out.append(tuple(task["args"]))
    return out


def _job(job) -> UpgradeJob:
    return UpgradeJob.objects.get(id=job.id)


def _docs(job) -> list[UpgradeDocument]:
    return list(UpgradeDocument.objects.filter(job=job).order_by("id").select_related("document"))


@pytest.fixture
def two(space):
    """A disabled document with metadata, an enabled one without."""
    return succeeded_job(
        space,
        [
            Legacy("hidden.txt", "Secret lagoon notes.", False, {"author": "Ann", "tier": 2}),
            Legacy("open.txt", "Public harbour notes."),
        ],
    )


# 17 --------------------------------------------------------------------------------------------
def test_metadata_then_availability_with_chained_row_versions(two):
    job, token = two
    outcome = rec.run_delivery(job.id, token)
    assert outcome.as_dict() == {
        "status": "completed",
        "reconciled": 2,
        "failed": 0,
        "remaining": 0,
        "next_token": None,
        "stopped_early": False,
    }
    hidden, shown = (d.document for d in _docs(job))
    hidden.refresh_from_db()
    shown.refresh_from_db()
    # Two writes on the disabled one (metadata 1→2, then availability 2→3); none on the other.
    assert (hidden.enabled, hidden.metadata, hidden.row_version) == (
        False,
        {"author": "Ann", "tier": 2},
        3,
    )
    assert (shown.enabled, shown.metadata, shown.row_version) == (True, {}, 1)
    assert all(d.state_reconciled_at is not None for d in _docs(job))
    row = _job(job)
    assert row.reconcile_completed_at is not None
    assert (row.reconcile_lease_token, row.reconcile_lease_expires_at) == (None, None)


def test_legacy_field_list_metadata_is_applied_as_a_patch(space):
    job, token = succeeded_job(
        space, [Legacy("a.txt", "Alpha notes.", True, [{"name": "lang", "value": "en"}])]
    )
    assert rec.run_delivery(job.id, token).status == "completed"
    assert _docs(job)[0].document.metadata == {"lang": "en"}


# 18 --------------------------------------------------------------------------------------------
def test_not_visible_and_metadata_errors_count_an_attempt_and_keep_the_error(space):
    job, token = succeeded_job(
        space,
        [
            Legacy("ok.txt", "Fine notes.", False),
            Legacy("bad-meta.txt", "Broken metadata notes.", True, "not an object"),
            Legacy("later.txt", "Not linked yet."),
        ],
    )
    missing = _docs(job)[2]
    missing.document.delete()  # the link of a succeeded hand-off becomes NULL: deleted
    outcome = rec.run_delivery(job.id, token)
    assert (outcome.reconciled, outcome.failed, outcome.remaining) == (2, 1, 1)
    assert outcome.status == "continued"  # progress was made: rotate and continue
    ok, bad, later = _docs(job)
    assert ok.state_reconciled_at is not None and ok.document.enabled is False
    assert bad.state_reconcile_attempt_count == 1
    assert bad.state_reconcile_error == "invalid_metadata: metadata must be a JSON object"
    assert bad.state_reconciled_at is None
    assert later.state_reconciled_at is not None and later.state_reconcile_attempt_count == 0
    assert later.state_reconcile_error.startswith("document_deleted: the new document was deleted")


def test_a_batch_without_progress_releases_the_lease_for_recovery(space):
    job, token = succeeded_job(space, [Legacy("x.txt", "Alpha.", True, "bad")])
    outcome = rec.run_delivery(job.id, token)
    assert (outcome.status, outcome.remaining) == ("released", 1)
    row = _job(job)
    assert row.reconcile_lease_token is None and row.reconcile_completed_at is None


def test_a_failing_document_waits_its_retry_delay_across_continuations(
    space, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = 2
    job, token = succeeded_job(
        space,
        [Legacy("bad.txt", "Bad.", True, "oops"), Legacy("b.txt", "B."), Legacy("c.txt", "C.")],
    )
    seen = []
    while token is not None:
        with django_capture_on_commit_callbacks(execute=True):
            outcome = rec.run_delivery(job.id, token)
        seen.append((outcome.status, outcome.reconciled, outcome.failed, outcome.remaining))
        token = outcome.next_token
    assert seen == [("continued", 1, 1, 2), ("continued", 1, 0, 1), ("released", 0, 0, 1)]
    assert _docs(job)[0].state_reconcile_attempt_count == 1  # one attempt, not three


def test_a_stale_row_version_is_a_typed_conflict(space):
    from ingestion.availability import (
        StaleRowVersion,
        patch_document_metadata,
        set_document_availability,
    )

    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.")])
    document = _docs(job)[0].document
    assert set_document_availability(document.id, False, 1) == 2
    with pytest.raises(StaleRowVersion) as caught:
        patch_document_metadata(document.id, {"k": "v"}, 1)
    assert caught.value.code == "document_version_conflict"
    assert caught.value.details == {"expected": 1, "current": 2}
    assert patch_document_metadata(document.id, {"k": "v"}, 2) == 3
    assert patch_document_metadata(document.id, {"k": "v"}, 3) == 3  # no change: no move


# 19 --------------------------------------------------------------------------------------------
def test_publication_failure_after_success_is_recovered_after_expiry(
    two, monkeypatch, django_capture_on_commit_callbacks
):
    job, token = two

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(django_q.tasks, "async_task", broker_down)
    assert rec.publish(job.id, token) is False  # the run swallows this after its commit
    monkeypatch.undo()
    row = _job(job)
    assert row.status == JobStatus.SUCCEEDED and row.reconcile_lease_token == token
    start = row.reconcile_lease_expires_at - TTL
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.recover_reconciliations(now=start + timedelta(seconds=60)).issued == []
    assert _published() == []  # the lease is still live: nothing to recover yet
    with django_capture_on_commit_callbacks(execute=True):
        report = rec.recover_reconciliations(now=row.reconcile_lease_expires_at)
    assert report.issued == [str(job.id)]
    ((job_id, new_token),) = _published()
    row = _job(job)
    assert (job_id, new_token) == (str(job.id), str(row.reconcile_lease_token))
    assert new_token != str(token) and row.reconcile_attempt_count == 2
    assert rec.run_delivery(job.id, token).status == "rejected"  # the old token is dead
    assert rec.run_delivery(job_id, new_token).status == "completed"
    reconciliation_gate.require_reconciled(job.space_id)  # the gate is open


# 20 --------------------------------------------------------------------------------------------
def test_interruption_before_publish_is_recovered(two, django_capture_on_commit_callbacks):
    job, token = two  # success + lease committed; the worker died before publishing
    expiry = _job(job).reconcile_lease_expires_at
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.recover_reconciliations(now=expiry + timedelta(seconds=1)).issued == [
            str(job.id)
        ]
    ((job_id, new_token),) = _published()
    assert rec.run_delivery(job_id, new_token).status == "completed"


def test_a_succeeded_job_without_any_lease_is_recovered_at_once(
    space, django_capture_on_commit_callbacks
):
    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.", False)], lease=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.recover_reconciliations().issued == [str(job.id)]
    ((job_id, token),) = _published()
    assert rec.run_delivery(job_id, token).status == "completed"
    assert _docs(job)[0].document.enabled is False


def test_a_succeeded_job_with_nothing_owed_is_still_marked_done(
    space, django_capture_on_commit_callbacks
):
    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.", handed_off=False)], lease=False)
    with pytest.raises(reconciliation_gate.ReconciliationPending):
        reconciliation_gate.require_reconciled(space.id)
    with django_capture_on_commit_callbacks(execute=True):
        rec.recover_reconciliations()
    ((job_id, token),) = _published()
    assert rec.run_delivery(job_id, token).status == "completed"
    # A failed hand-off has no document: it holds nothing.
    reconciliation_gate.require_reconciled(space.id)


# 21 --------------------------------------------------------------------------------------------
def test_lost_delivery_two_recovery_ticks_reissue_exactly_once(
    two, django_capture_on_commit_callbacks
):
    job, token = two  # the broker dropped the message carrying ``token``
    expiry = _job(job).reconcile_lease_expires_at
    assert rec.recover_reconciliations(now=expiry - timedelta(seconds=1)).issued == []
    later = expiry + timedelta(seconds=5)
    with django_capture_on_commit_callbacks(execute=True):
        first = rec.recover_reconciliations(now=later)
        second = rec.recover_reconciliations(now=later)
    assert (first.issued, second.issued) == ([str(job.id)], [])
    assert len(_published()) == 1 and _job(job).reconcile_attempt_count == 2
    # The same race at the compare-and-set itself: both saw the expired ``token``.
    row = _job(job)
    UpgradeJob.objects.filter(id=job.id).update(reconcile_lease_expires_at=later)
    seen = dict(seen_token=row.reconcile_lease_token, seen_expires_at=later, now=later)
    results = [rec.issue_lease(job.id, **seen), rec.issue_lease(job.id, **seen)]
    assert results[0] is not None and results[1] is None


# 22 --------------------------------------------------------------------------------------------
def test_stale_worker_checkpoint_is_fenced_and_the_new_holder_completes(
    two, django_capture_on_commit_callbacks
):
    job, t1 = two
    expiry = _job(job).reconcile_lease_expires_at
    start = expiry - TTL
    clock = SteppingClock(start)

    def expire_and_reissue():
        # Worker A stalls past its lease; a recovery tick issues T2 before A's first checkpoint.
        with django_capture_on_commit_callbacks(execute=True):
            assert rec.recover_reconciliations(now=expiry).issued == [str(job.id)]
        return expiry + timedelta(seconds=1)

    # Calls: accept, deadline, budget check (A stalls here), then the checkpoint's fence.
    clock.hooks[3] = expire_and_reissue
    outcome = rec.run_delivery(job.id, t1, clock=clock)
    assert outcome.status == "lease_lost" and outcome.reconciled == 0
    assert all(
        d.state_reconciled_at is None and d.state_reconcile_attempt_count == 0 for d in _docs(job)
    )
    assert _docs(job)[0].document.row_version == 1  # no document write either
    ((_, t2),) = _published()
    assert rec.run_delivery(job.id, t2).status == "completed"


def test_stale_worker_completion_is_rejected(space, django_capture_on_commit_callbacks):
    job, t1 = succeeded_job(space, [Legacy("a.txt", "Alpha.", False)])
    expiry = _job(job).reconcile_lease_expires_at
    clock = SteppingClock(expiry - TTL)

    def expire_and_reissue():
        with django_capture_on_commit_callbacks(execute=True):
            rec.recover_reconciliations(now=expiry)
        return expiry + timedelta(seconds=1)

    clock.hooks[5] = expire_and_reissue  # after A's (valid) checkpoint, before its completion
    outcome = rec.run_delivery(job.id, t1, clock=clock)
    assert (outcome.status, outcome.reconciled) == ("lease_lost", 1)
    row = _job(job)
    assert row.reconcile_completed_at is None and row.reconcile_lease_token is not None
    assert row.reconcile_lease_token != t1
    ((_, t2),) = _published()
    assert rec.run_delivery(job.id, t2).as_dict()["status"] == "completed"


# 23 --------------------------------------------------------------------------------------------
def _snapshot(job):
    return (
        list(UpgradeJob.objects.filter(id=job.id).values()),
        list(UpgradeDocument.objects.filter(job=job).order_by("id").values()),
        list(Document.objects.order_by("id").values("id", "row_version", "enabled", "metadata")),
    )


def test_duplicate_and_after_done_deliveries_change_nothing(
    space, settings, django_assert_num_queries, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = 1
    job, t1 = succeeded_job(space, [Legacy("a.txt", "Alpha.", False), Legacy("b.txt", "Beta.")])
    with django_capture_on_commit_callbacks(execute=True):
        first = rec.run_delivery(job.id, t1)
    assert first.status == "continued"
    before = _snapshot(job)
    with django_assert_num_queries(1):  # the acceptance read only: no write, no lookup
        assert rec.run_delivery(job.id, t1).status == "rejected"  # redelivered after rotation
    assert _snapshot(job) == before
    t2 = first.next_token
    assert rec.run_delivery(job.id, t2).status == "completed"
    done = _snapshot(job)
    for token in (t1, t2, uuid.uuid4(), "not-a-token"):
        with django_assert_num_queries(0 if token == "not-a-token" else 1):
            assert rec.run_delivery(job.id, token).status == "rejected"
    assert _snapshot(job) == done


# 24 --------------------------------------------------------------------------------------------
def test_bounded_batches_rotate_and_publish_continuations(
    space, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = 2
    job, token = succeeded_job(
        space, [Legacy(f"{n}.txt", f"Note number {n}.", n % 2 == 0) for n in range(5)]
    )
    seen = [token]
    statuses = []
    while True:
        with django_capture_on_commit_callbacks(execute=True):
            outcome = rec.run_delivery(job.id, seen[-1])
        statuses.append((outcome.status, outcome.reconciled, outcome.remaining))
        if outcome.status != "continued":
            break
        assert _published()[-1] == (str(job.id), str(outcome.next_token))
        seen.append(outcome.next_token)
    assert statuses == [("continued", 2, 3), ("continued", 2, 1), ("completed", 1, 0)]
    assert len(set(seen)) == 3 and _job(job).reconcile_attempt_count == 3
    assert [d.document.enabled for d in _docs(job)] == [True, False, True, False, True]


def test_a_delivery_stops_when_its_time_budget_is_spent(
    space, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS = 60
    job, token = succeeded_job(space, [Legacy(f"{n}.txt", f"Note {n}.") for n in range(4)])
    start = _job(job).reconcile_lease_expires_at - TTL
    clock = SteppingClock(start, step=timedelta(seconds=25))  # 25 s per clock read
    with django_capture_on_commit_callbacks(execute=True):
        outcome = rec.run_delivery(job.id, token, clock=clock)
    assert (outcome.status, outcome.stopped_early, outcome.reconciled) == ("continued", True, 1)
    assert rec.hard_timeout_seconds() == (60 + 300) // 2
    message = OrmQ.objects.get().task  # the continuation carries the hard timeout
    assert (message["args"], message["timeout"]) == ((str(job.id), str(outcome.next_token)), 180)


@pytest.mark.parametrize(
    "budget,lease,ok", [("150", "300", True), ("151", "300", False), ("60", "100", False)]
)
def test_time_budget_must_be_at_most_half_the_lease(budget, lease, ok):
    from knowledgefs.testing.django_start import setup_django

    result = setup_django(
        KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS=budget,
        KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS=lease,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert (
            f"KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS={budget} must be at most half "
            f"of KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS={lease}"
        ) in result.stderr


# 25 --------------------------------------------------------------------------------------------
def test_recovery_ignores_live_done_dead_lettered_and_unfinished_jobs(space, principal):
    from spaces.services import create_space

    def new_space(name):
        return create_space(principal, name=name)

    live, _ = succeeded_job(new_space("live"), [Legacy("a.txt", "Alpha live.")])
    done, _ = succeeded_job(new_space("done"), [Legacy("b.txt", "Beta done.")], lease=False)
    UpgradeJob.objects.filter(id=done.id).update(reconcile_completed_at=timezone.now())
    dead, _ = succeeded_job(new_space("dead"), [Legacy("c.txt", "Gamma dead.")], lease=False)
    UpgradeJob.objects.filter(id=dead.id).update(reconcile_dead_lettered_at=timezone.now())
    for status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED):
        succeeded_job(new_space(status), [Legacy(f"{status}.txt", f"{status} x.")], status=status)
    before = list(UpgradeJob.objects.order_by("id").values())
    report = rec.recover_reconciliations()
    assert (report.candidates, report.issued) == (0, [])
    assert list(UpgradeJob.objects.order_by("id").values()) == before
    assert live.id  # its lease is live


# 27 --------------------------------------------------------------------------------------------
def test_the_recovery_schedule_exists_after_migrate():
    schedule = Schedule.objects.get(name="knowledgefs.recover_reconciliations")
    assert (schedule.func, schedule.schedule_type, schedule.minutes, schedule.repeats) == (
        "upgrades.reconciliation_tasks.recover_reconciliations",
        "I",
        1,
        -1,
    )
    schedule.delete()
    call_command("kfs", "schedules")
    assert Schedule.objects.filter(name="knowledgefs.recover_reconciliations").count() == 1


def test_the_task_entry_points_run_the_services(two, django_capture_on_commit_callbacks):
    from upgrades import tasks

    job, token = two
    assert tasks.reconcile_documents(str(job.id), str(token))["status"] == "completed"
    assert tasks.recover_reconciliations() == {"candidates": 0, "issued": []}


# G4 --------------------------------------------------------------------------------------------
def test_only_the_batch_documents_are_looked_up(space, settings):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = 2
    for n in range(6):  # other documents of the space, never listed
        from ingestion.documents import admit_document

        admit_document(space, filename=f"other{n}.txt", data=f"Other {n}.".encode(), enqueue=False)
    job, token = succeeded_job(space, [Legacy(f"{n}.txt", f"Mine {n}.") for n in range(3)])
    with CaptureQueriesContext(connection) as queries:
        rec.run_delivery(job.id, token)
    reads = [
        q["sql"]
        for q in queries
        if q["sql"].startswith("SELECT") and "ingestion_document" in q["sql"]
    ]
    assert len(reads) == 1 and " IN (" in reads[0]


def test_dead_letter_after_capped_attempts_then_rearm(
    space, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS = 2
    job, token = succeeded_job(
        space,
        [Legacy("ok.txt", "Fine.", False), Legacy("gone.txt", "Vanished.", False, "not an object")],
    )
    gone = _docs(job)[1]
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.run_delivery(job.id, token).status == "continued"  # ok reconciled
    ((_, t2),) = _published()
    # At once: the failed document is within its retry delay, so nothing is due and no attempt
    # is spent; the lease goes back to recovery.
    released = rec.run_delivery(job.id, t2)
    assert (released.status, released.remaining, released.failed) == ("released", 1, 0)
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.recover_reconciliations().issued == [str(job.id)]
    t3 = _published()[-1][1]
    a_minute_on = timezone.now() + timedelta(seconds=61)
    outcome = rec.run_delivery(job.id, t3, clock=lambda: a_minute_on)
    assert outcome.status == "dead_lettered"  # second failure: capped
    doc = UpgradeDocument.objects.get(id=gone.id)
    assert doc.state_reconcile_attempt_count == 2 and doc.state_dead_lettered_at is not None
    row = _job(job)
    assert row.reconcile_dead_lettered_at is not None and row.reconcile_completed_at is None
    assert rec.recover_reconciliations().issued == []  # recovery leaves it to the operator
    with pytest.raises(reconciliation_gate.ReconciliationPending) as refused:
        reconciliation_gate.require_reconciled(space.id)
    assert refused.value.details == {
        "job_id": str(job.id),
        "job_status": "succeeded",
        "owed_documents": 0,
        "dead_lettered_documents": 1,
    }
    assert "1 documents of upgrade job" in refused.value.message
    assert "re-arm dead-lettered reconciliation" in refused.value.message
    # The operator repairs the snapshot and re-arms; recovery does the rest.
    UpgradeDocument.objects.filter(id=gone.id).update(metadata_snapshot={"lang": "en"})
    assert reconciliation_ledger.rearm_dead_lettered(job.id) == 1
    doc.refresh_from_db()
    assert (doc.state_dead_lettered_at, doc.state_reconcile_attempt_count) == (None, 0)
    with django_capture_on_commit_callbacks(execute=True):
        assert rec.recover_reconciliations().issued == [str(job.id)]
    assert rec.run_delivery(job.id, _published()[-1][1]).status == "completed"
    fresh = Document.objects.get(id=doc.document_id)
    assert (fresh.enabled, fresh.metadata) == (False, {"lang": "en"})
    reconciliation_gate.require_reconciled(space.id)


def test_rearm_of_an_unknown_job_is_404():
    from knowledgefs.errors import NotFound

    with pytest.raises(NotFound) as missing:
        reconciliation_ledger.rearm_dead_lettered(uuid.uuid4())
    assert missing.value.code == "upgrade_job_not_found"


def test_admin_action_rearms_and_reports(space, rf, admin_user):
    from django.contrib import admin as django_admin
    from django.contrib.messages.storage.fallback import FallbackStorage

    from upgrades.admin.reconcile_actions import (
        rearm_dead_lettered_reconciliation,
        reconciliation_state,
    )

    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.")], lease=False)
    UpgradeDocument.objects.filter(job=job).update(
        state_dead_lettered_at=timezone.now(), state_reconcile_attempt_count=20
    )
    UpgradeJob.objects.filter(id=job.id).update(reconcile_dead_lettered_at=timezone.now())
    assert reconciliation_state(_job(job)) == "dead-lettered"
    request = rf.post("/admin/")
    request.user = admin_user
    request.session = {}
    request._messages = FallbackStorage(request)
    modeladmin = django_admin.ModelAdmin(UpgradeJob, django_admin.site)
    rearm_dead_lettered_reconciliation(modeladmin, request, UpgradeJob.objects.filter(id=job.id))
    assert [str(m) for m in request._messages] == [
        "Re-armed 1 dead-lettered documents in 1 jobs; recovery re-issues them within a minute."
    ]
    assert reconciliation_state(_job(job)) == "owed"


# Retrieval gate --------------------------------------------------------------------------------
def test_retrieval_is_refused_until_reconciled_on_the_api_and_the_cli(space, client, principal):
    from knowledgefs.testing.fixtures import compile_all
    from spaces.services import create_space

    job, token = succeeded_job(
        space, [Legacy("hidden.txt", "Lagoon secrets live here.", False), Legacy("b.txt", "Bay.")]
    )
    other = create_space(principal, name="Not an upgrade")
    from ingestion.documents import admit_document

    admit_document(other, filename="l.txt", data=b"Lagoon secrets elsewhere.", enqueue=False)
    compile_all()
    url = f"/v1/knowledge-spaces/{space.id}/retrieval-tests"
    response = client.post(url, {"query": "lagoon secrets"}, format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "space_reconciliation_pending"
    assert body["message"] == (
        f"retrieval on this space is paused: 2 documents of upgrade job {job.id} still owe their "
        "availability and metadata; retrieval opens once they are applied"
    )
    assert body["details"]["owed_documents"] == 2
    with pytest.raises(CommandError, match="^space_reconciliation_pending: retrieval on this"):
        call_command(
            "kfs", "query", "lagoon secrets", "--space", space.slug, "--tenant", space.tenant_id
        )
    ok = client.post(
        f"/v1/knowledge-spaces/{other.id}/retrieval-tests", {"query": "lagoon"}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["items"]
    assert rec.run_delivery(job.id, token).status == "completed"
    opened = client.post(url, {"query": "lagoon secrets bay"}, format="json")
    assert opened.status_code == 200
    assert [i["citation"]["filename"] for i in opened.json()["items"]] == ["b.txt"]


def test_a_space_whose_upgrade_is_still_running_is_gated(space):
    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.")], status=JobStatus.RUNNING)
    with pytest.raises(reconciliation_gate.ReconciliationPending) as refused:
        reconciliation_gate.require_reconciled(space.id)
    assert refused.value.message == (
        f"retrieval on this space is paused: its upgrade (job {job.id}) is running; documents are "
        "reconciled once it succeeds"
    )


@pytest.mark.django_db(transaction=True)
def test_the_schedule_migration_is_reversible():
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("upgrades", "0001_upgrade_jobs")])
        assert not Schedule.objects.filter(name=rec.RECOVERY_SCHEDULE).exists()
        executor = MigrationExecutor(connection)
        executor.migrate([("upgrades", "0005_reconciliation_recovery_schedule")])
        assert Schedule.objects.get(name=rec.RECOVERY_SCHEDULE).func == rec.RECOVERY_FUNCTION
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


# Deleted documents and deduplicated hand-offs ---------------------------------------------------
def test_a_document_deleted_by_the_tenant_owes_nothing_and_the_gate_opens(space, client):
    from knowledgefs.testing.fixtures import compile_all

    job, token = succeeded_job(
        space, [Legacy("gone.txt", "Walrus tusk ledger.", False), Legacy("kept.txt", "Kelp bay.")]
    )
    gone = _docs(job)[0].document
    deleted = client.delete(f"/v1/knowledge-spaces/{space.id}/documents/{gone.id}")
    assert deleted.status_code == 204
    assert rec.run_delivery(job.id, token).status == "completed"
    first, second = _docs(job)
    assert first.document is None and first.state_reconciled_at is not None
    assert first.state_dead_lettered_at is None and first.state_reconcile_attempt_count == 0
    assert first.state_reconcile_error == (
        "document_deleted: the new document was deleted before its availability and metadata "
        "were applied; nothing of it can be served, so nothing is owed"
    )
    assert second.state_reconciled_at is not None and second.state_reconcile_error is None
    reconciliation_gate.require_reconciled(space.id)  # the gate is open
    compile_all()
    response = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests", {"query": "kelp bay"}, format="json"
    )
    assert response.status_code == 200
    assert [i["citation"]["filename"] for i in response.json()["items"]] == ["kept.txt"]


def test_a_dead_lettered_document_deleted_later_completes_after_rearm(space, settings):
    settings.KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS = 1
    job, token = succeeded_job(space, [Legacy("bad.txt", "Broken walrus.", True, "not an object")])
    assert rec.run_delivery(job.id, token).status == "dead_lettered"
    _docs(job)[0].document.delete()
    assert reconciliation_ledger.rearm_dead_lettered(job.id) == 1
    report = rec.recover_reconciliations()
    assert report.issued == [str(job.id)]
    assert rec.run_delivery(job.id, _job(job).reconcile_lease_token).status == "completed"
    item = _docs(job)[0]
    assert item.state_reconciled_at is not None and item.state_dead_lettered_at is None
    assert item.state_reconcile_error.startswith("document_deleted: ")


@pytest.mark.parametrize("flags", [(True, False), (False, True)], ids=["ef", "fe"])
@pytest.mark.parametrize("batch", [1, 10])
def test_legacy_documents_sharing_bytes_get_one_merged_state(space, client, settings, flags, batch):
    from knowledgefs.testing.fixtures import compile_all

    settings.KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = batch
    text = "PINEAPPLE policies: the orchard ships on Tuesdays."
    job, token = succeeded_job(
        space,
        [
            Legacy("first.txt", text, flags[0], {"k": "first"}),
            Legacy("second.txt", text, flags[1], {"k": "second", "only2": "x"}),
        ],
    )
    first, second = _docs(job)
    assert first.document_id == second.document_id  # deduplicated onto one document
    outcome = rec.run_delivery(job.id, token)
    assert (outcome.status, outcome.reconciled, outcome.failed) == ("completed", 2, 0)
    document = Document.objects.get(id=first.document_id)
    assert (document.enabled, document.metadata) == (True, {"k": "first", "only2": "x"})
    assert document.row_version == 2  # metadata once; availability unchanged (already on)
    note = (
        f"document_merged: legacy documents legacy-0, legacy-1 share document {document.id}; "
        "enabled=true (any of them enabled); metadata merged in legacy order, the first value "
        "wins; conflicts: 'k': kept 'first' of legacy-0, dropped 'second' of legacy-1"
    )
    first, second = _docs(job)
    assert first.state_reconciled_at == second.state_reconciled_at is not None
    assert first.state_reconcile_error == second.state_reconcile_error == note
    assert (first.state_reconcile_attempt_count, second.state_reconcile_attempt_count) == (0, 0)
    compile_all()
    response = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests",
        {"query": "PINEAPPLE policies"},
        format="json",
    )
    assert response.status_code == 200
    assert [i["citation"]["filename"] for i in response.json()["items"]] == ["first.txt"]


def test_shared_document_stays_disabled_when_no_legacy_document_is_enabled(space):
    text = "Quince archive, closed."
    job, token = succeeded_job(
        space, [Legacy("a.txt", text, False, {"k": 1}), Legacy("b.txt", text, False, {"k": 1})]
    )
    assert rec.run_delivery(job.id, token).status == "completed"
    document = _docs(job)[0].document
    assert (document.enabled, document.metadata) == (False, {"k": 1})
    assert _docs(job)[1].state_reconcile_error.endswith(
        "metadata merged in legacy order, the first value wins"
    )


def test_a_document_deleted_between_lookup_and_write_is_reconciled_as_deleted(space):
    job, token = succeeded_job(space, [Legacy("late.txt", "Narwhal ledger.", False, {"a": 1})])
    document_id = _docs(job)[0].document_id
    clock = SteppingClock(timezone.now())
    # Calls: accept, batch start, deadline check, then the checkpoint: delete just before it.
    clock.hooks[4] = lambda: (Document.objects.filter(id=document_id).delete(), clock.now)[1]
    assert rec.run_delivery(job.id, token, clock=clock).status == "completed"
    item = _docs(job)[0]
    assert item.state_reconciled_at is not None and item.state_reconcile_attempt_count == 0
    assert item.state_reconcile_error.startswith(
        f"document_deleted: the new document {document_id} was deleted"
    )
