"""Real concurrency on PostgreSQL: two recovery ticks for one lost delivery re-issue exactly once
(upgrade spec §5.3 case 21), whether the second tick meets the first one's row lock (SKIP LOCKED)
or races it at the compare-and-set. Skipped on SQLite, whose writers are serialised (the
sequential version of the same case is in test_upgrade_reconciliation.py)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django_q.models import OrmQ

from knowledgefs.testing.upgrade_factories import Legacy, succeeded_job
from upgrades.models import UpgradeJob
from upgrades.services import reconciliation_runner as rec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL row locks and SKIP LOCKED")


def _thread(target, results, key):
    def run():
        try:
            results[key] = target()
        except Exception as exc:  # noqa: BLE001
            results[key] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_two_concurrent_recovery_ticks_reissue_exactly_once(space):
    job, _ = succeeded_job(space, [Legacy("a.txt", "Alpha.", False)])
    later = UpgradeJob.objects.get(id=job.id).reconcile_lease_expires_at + timedelta(seconds=1)
    first_done = threading.Event()
    release = threading.Event()
    results: dict = {}

    def tick_a():  # holds its transaction open after issuing, until B has run
        with transaction.atomic():
            report = rec.recover_reconciliations(now=later)
            first_done.set()
            assert release.wait(20)
        return report

    a = _thread(tick_a, results, "a")
    assert first_done.wait(20)
    b = _thread(lambda: rec.recover_reconciliations(now=later), results, "b")
    b.join(20)
    release.set()
    a.join(20)
    assert results["a"].issued == [str(job.id)]
    assert (results["b"].candidates, results["b"].issued) == (0, [])  # the row was locked
    # A third tick after A's commit sees A's live lease.
    assert rec.recover_reconciliations(now=later).issued == []
    row = UpgradeJob.objects.get(id=job.id)
    assert row.reconcile_attempt_count == 2
    assert OrmQ.objects.count() == 1
    ((job_id, token),) = [m.task["args"] for m in OrmQ.objects.all()]
    assert token == str(row.reconcile_lease_token)
    assert rec.run_delivery(job_id, token).status == "completed"


def test_two_issues_racing_at_the_compare_and_set_yield_one_token(space):
    job, t1 = succeeded_job(space, [Legacy("a.txt", "Alpha.")])
    row = UpgradeJob.objects.get(id=job.id)
    later = row.reconcile_lease_expires_at + timedelta(seconds=1)
    seen = dict(seen_token=t1, seen_expires_at=row.reconcile_lease_expires_at, now=later)
    issued_a = threading.Event()
    release = threading.Event()
    results: dict = {}

    def issue_a():
        with transaction.atomic():
            token = rec.issue_lease(job.id, **seen)
            issued_a.set()
            assert release.wait(20)
        return token

    a = _thread(issue_a, results, "a")
    assert issued_a.wait(20)
    b = _thread(lambda: rec.issue_lease(job.id, **seen), results, "b")
    b.join(1)
    assert b.is_alive()  # B's UPDATE waits on A's row lock
    release.set()
    a.join(20)
    b.join(20)
    assert results["a"] is not None and results["b"] is None  # re-checked after A's commit
    assert UpgradeJob.objects.get(id=job.id).reconcile_lease_token == results["a"]


def test_a_checkpoint_holds_off_recovery_until_it_commits(space):
    """A delivery's checkpoint locks the job row by its fence; a recovery tick that starts once
    the lease expired waits, then finds the lease the checkpoint was written under and replaces
    it: the checkpoint is never lost and never written under a foreign token."""
    job, t1 = succeeded_job(space, [Legacy("a.txt", "Alpha.", False)])
    row = UpgradeJob.objects.get(id=job.id)
    lease = rec.Lease(job.id, t1, row.reconcile_lease_expires_at)
    fenced = threading.Event()
    release = threading.Event()
    results: dict = {}

    def checkpoint():
        with transaction.atomic():
            rec._fence(lease, row.reconcile_lease_expires_at - timedelta(seconds=1))
            fenced.set()
            assert release.wait(20)
        return True

    a = _thread(checkpoint, results, "a")
    assert fenced.wait(20)
    later = row.reconcile_lease_expires_at + timedelta(seconds=1)
    seen = dict(seen_token=t1, seen_expires_at=row.reconcile_lease_expires_at, now=later)
    b = _thread(lambda: rec.issue_lease(job.id, **seen), results, "b")
    b.join(1)
    assert b.is_alive()
    release.set()
    a.join(20)
    b.join(20)
    assert results["a"] is True and results["b"] is not None
