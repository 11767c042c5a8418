"""The upgrade bridge across its seams: the staged run's success commit hands the first lease to
reconciliation, which opens the retrieval gate; failures between the two are healed by the
recovery tick (bridge specification §5.3 cases 19-21; gaps G1, G4).

(a) and (d) run on a real django-q2 cluster (ORM broker, forked from this process, so it sees
this test's settings); (b) and (c) drive the real runner and the real reconciliation deliveries
message by message from the ORM queue, with the lease expiry moved by the recovery tick's
``now`` (the time seam) instead of sleeping.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.brokers.orm import ORM
from django_q.cluster import Cluster
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from ingestion.models import Document, DocumentState
from knowledgefs.errors import Conflict
from knowledgefs.testing.upgrade_factories import Legacy, succeeded_job
from knowledgefs.testing.upgrade_support import (
    INNER_KEY,
    RECONCILE_FUNC,
    inner,
    legacy_file,
    messages,
    snapshot_body,
)
from upgrades.models import JobStage, UpgradeJob
from upgrades.services import reconciliation_runner as rec
from upgrades.services.reconciliation_gate import require_reconciled
from upgrades.tasks import reconcile_documents, run_upgrade_step

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

REEF = b"Coral reef divers photograph parrotfish at dawn near the lagoon.\n"
DUNES = b"Desert dunes migrate slowly with the prevailing westerly wind.\n"
GLACIER = b"Glacier ice calves icebergs into the fjord every summer.\n"


class RefusingReconcileBroker(ORM):
    """The ORM broker, except that it refuses every reconcile publish
    (``KNOWLEDGE_UPGRADE_BROKER_CLASS``): step messages flow, the reconciliation delivery of
    the success commit is lost as when the broker fails at that moment."""

    def enqueue(self, task):
        if SignedPackage.loads(task)["func"] == RECONCILE_FUNC:
            raise ConnectionError("broker refuses reconcile publishes (test seam)")
        return super().enqueue(task)


@pytest.fixture(autouse=True)
def inner_key(settings):
    settings.DIFY_INNER_API_KEY = INNER_KEY


@pytest.fixture
def cluster(inner_key):
    connections.close_all()  # no forked worker may inherit (and close) our connection
    running = Cluster(get_broker())
    running.start()
    yield running
    running.stop()


def _wait(predicate, what: str, seconds: float = 120, every: float = 0.1):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"{what} did not happen in {seconds}s")


def three_legacy_files() -> list[dict]:
    """One enabled with metadata, one disabled in the Dataset, one archived."""
    return [
        legacy_file("reef.txt", REEF, doc_id="reef", metadata={"team": "ocean", "year": 2024}),
        legacy_file("dunes.txt", DUNES, doc_id="dunes", desired_enabled=False, metadata={}),
        legacy_file("glacier.txt", GLACIER, doc_id="glacier", archived=True, metadata={}),
    ]


def start(documents: list[dict], **overrides) -> UpgradeJob:
    response = inner().post(
        "/internal/dataset-upgrades", snapshot_body(documents, **overrides), format="json"
    )
    assert response.status_code == 201, response.content
    return UpgradeJob.objects.get(id=response.json()["id"])


def reload(job: UpgradeJob) -> UpgradeJob:
    return UpgradeJob.objects.get(id=job.id)


def gate_code(space_id) -> str:
    try:
        require_reconciled(space_id)
    except Conflict as refused:
        return refused.code
    return "open"


def query(client, space_id, text: str):
    url = f"/v1/knowledge-spaces/{space_id}/retrieval-tests"
    return client.post(url, {"query": text, "top_k": 5}, format="json")


def step_until(job: UpgradeJob, stage: str) -> tuple:
    """Deliver step messages one by one until the next waiting one is for ``stage``; returns
    that message's args (still queued)."""
    for _ in range(50):
        (message_id, args), *_ = messages()
        if reload(job).stage == stage:
            return message_id, args
        OrmQ.objects.filter(id=message_id).delete()
        run_upgrade_step(*args)
    raise AssertionError(f"never reached {stage}")


def deliver_reconciliations() -> list[dict]:
    """Deliver the waiting reconcile messages (and their continuations) in this process."""
    results = []
    for _ in range(50):
        waiting = messages(RECONCILE_FUNC)
        if not waiting:
            return results
        message_id, args = waiting[0]
        OrmQ.objects.filter(id=message_id).delete()
        results.append(reconcile_documents(*args))
    raise AssertionError(f"still reconciling: {results[-5:]}")


def assert_reconciled(job: UpgradeJob) -> None:
    job = reload(job)
    assert job.reconcile_completed_at is not None and job.reconcile_lease_token is None
    documents = {d.filename: d for d in Document.objects.filter(space_id=job.space_id)}
    assert {name: d.enabled for name, d in documents.items()} == {
        "reef.txt": True,
        "dunes.txt": False,
        "glacier.txt": False,
    }
    assert documents["reef.txt"].metadata == {"team": "ocean", "year": 2024}
    assert gate_code(job.space_id) == "open"


# --- (a) the whole bridge on a cluster ----------------------------------------------------------


def test_cluster_upgrade_reconciles_then_serves_only_the_enabled_document(client, cluster):
    job = start(three_legacy_files())
    gates = []

    def reconciled() -> bool:
        current = reload(job)
        if current.space_id and current.reconcile_completed_at is None:
            code = gate_code(current.space_id)
            # The cluster may finish between the two reads: an open gate counts only while the
            # reconciliation is still unfinished after it was read.
            if code != "open" or reload(job).reconcile_completed_at is None:
                gates.append(code)
        return current.reconcile_completed_at is not None

    _wait(reconciled, "the run and its reconciliation", every=0.02)
    job = reload(job)
    assert (job.status, job.stage, job.completed_documents, job.failed_documents) == (
        "succeeded",
        "completed",
        3,
        0,
    )
    # The success commit carried the first lease: one UPDATE, one clock reading.
    assert job.reconcile_dispatched_at == job.completed_at
    assert job.reconcile_attempt_count == 1  # no re-issue was needed
    assert gates and set(gates) == {"space_reconciliation_pending"}
    assert_reconciled(job)

    _wait(
        lambda: (
            Document.objects.filter(space_id=job.space_id, state=DocumentState.PUBLISHED).count()
            == 3
        ),
        "compilation of the three documents",
    )
    for text in ("desert dunes migrate westerly wind", "glacier icebergs fjord summer"):
        answer = query(client, job.space_id, text)
        assert answer.status_code == 200, answer.json()
        served = [item["citation"]["filename"] for item in answer.json()["items"]]
        assert "dunes.txt" not in served and "glacier.txt" not in served, (text, served)
    answer = query(client, job.space_id, "coral reef parrotfish lagoon")
    assert answer.status_code == 200, answer.json()
    items = answer.json()["items"]
    assert [item["citation"]["filename"] for item in items][:1] == ["reef.txt"]
    assert "parrotfish" in items[0]["text"]


# --- (b) publication failure after the success commit -------------------------------------------


def test_a_refused_reconcile_publish_is_healed_by_recovery_after_the_lease_expires(settings):
    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = f"{__name__}.RefusingReconcileBroker"
    job = start(three_legacy_files())
    message_id, args = step_until(job, JobStage.FINALIZING)
    OrmQ.objects.filter(id=message_id).delete()
    assert run_upgrade_step(*args) == "succeeded"  # the real runner's finalize step
    job = reload(job)
    assert job.status == "succeeded" and job.reconcile_lease_token is not None
    assert messages(RECONCILE_FUNC) == []  # the publish was refused and swallowed
    assert gate_code(job.space_id) == "space_reconciliation_pending"

    settings.KNOWLEDGE_UPGRADE_BROKER_CLASS = ""  # the broker is back
    assert rec.recover_reconciliations().issued == []  # the first lease is still live
    after_expiry = job.reconcile_lease_expires_at + timedelta(seconds=1)
    assert rec.recover_reconciliations(now=after_expiry).issued == [str(job.id)]
    reissued = reload(job)
    assert reissued.reconcile_lease_token != job.reconcile_lease_token
    assert reissued.reconcile_attempt_count == 2
    # The first token, were it ever delivered, is refused: fenced by the new lease.
    assert reconcile_documents(str(job.id), str(job.reconcile_lease_token))["status"] == (
        "rejected"
    )
    assert [r["status"] for r in deliver_reconciliations()][-1] == "completed"
    assert_reconciled(job)


# --- (c) interruption between the success commit and the publish --------------------------------


def test_a_finalize_whose_publish_never_ran_is_healed_by_recovery():
    job = start(three_legacy_files())
    message_id, args = step_until(job, JobStage.FINALIZING)
    OrmQ.objects.filter(id=message_id).delete()
    with transaction.atomic():
        assert run_upgrade_step(*args) == "succeeded"
        # The process dies at the commit: the success is durable, the hooks never run.
        connection.run_on_commit.clear()
    job = reload(job)
    assert job.status == "succeeded" and job.reconcile_lease_token is not None
    assert messages(RECONCILE_FUNC) == [] and messages() == []
    assert gate_code(job.space_id) == "space_reconciliation_pending"

    assert rec.recover_reconciliations(now=job.reconcile_lease_expires_at).issued == [str(job.id)]
    assert [r["status"] for r in deliver_reconciliations()][-1] == "completed"
    assert_reconciled(job)
    assert reload(job).reconcile_attempt_count == 2


# --- (d) the G1 sweep and the reconciliation recovery in one tick -------------------------------


def test_sweep_and_recovery_in_one_cluster_tick_each_heal_their_own_job(space, settings):
    # Job A: claimed, but its message never reached the broker (G1: dispatcher died).
    a = start(three_legacy_files())
    lost_claim = reload(a).task_id
    assert lost_claim and OrmQ.objects.count() == 1
    OrmQ.objects.all().delete()
    grace = settings.KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS
    UpgradeJob.objects.filter(id=a.id).update(
        claimed_at=timezone.now() - timedelta(seconds=grace + 60)
    )
    # Job B: succeeded, its lease expired without a delivery (the reconcile publish was lost).
    b, first = succeeded_job(
        space,
        [Legacy("moss.txt", "Moss grows on the north side of rocks.", desired_enabled=False)],
        now=timezone.now() - timedelta(seconds=settings.KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS),
    )
    assert gate_code(space.id) == "space_reconciliation_pending"

    connections.close_all()
    running = Cluster(get_broker())
    running.start()
    try:
        async_task("upgrades.tasks.sweep_upgrades")  # one tick of both schedules
        async_task(rec.RECOVERY_FUNCTION)
        _wait(
            lambda: (
                UpgradeJob.objects.filter(
                    id__in=[a.id, b.id], reconcile_completed_at__isnull=False
                ).count()
                == 2
            ),
            "the run of A and the reconciliation of both jobs",
        )
    finally:
        running.stop()
    a, b = reload(a), reload(b)
    assert a.status == "succeeded" and a.reconcile_attempt_count == 1  # recovery left A alone
    assert b.reconcile_attempt_count == 2  # issued once by recovery, never by the sweep
    assert b.reconcile_lease_token is None and b.reconcile_lease_token != first
    assert_reconciled(a)
    assert Document.objects.get(space=space, filename="moss.txt").enabled is False
    assert gate_code(space.id) == "open"
    # A's lost claim, delivered late, is refused and writes nothing.
    assert run_upgrade_step(str(a.id), lost_claim) == "stale"


# --- list and message shape (cases 5 and 26, adapted) -------------------------------------------


def test_the_list_filters_by_status_within_the_tenant():
    failed = start([legacy_file("a.txt", REEF)], dataset_id="ds-failed", idempotency_key="k-1")
    UpgradeJob.objects.filter(id=failed.id).update(status="failed", task_id=None)
    queued = start([legacy_file("b.txt", DUNES)], dataset_id="ds-queued", idempotency_key="k-2")
    start([], namespace_id="tenant-b", dataset_id="ds-other", idempotency_key="k-3")
    url = "/internal/dataset-upgrades?namespace_id=tenant-a"
    ids = {
        status: [j["id"] for j in inner().get(f"{url}&status={status}").json()["results"]]
        for status in ("failed", "queued", "succeeded")
    }
    assert ids == {"failed": [str(failed.id)], "queued": [str(queued.id)], "succeeded": []}
    every = [j["id"] for j in inner().get(url).json()["results"]]
    assert sorted(every) == sorted([str(failed.id), str(queued.id)])  # tenant-b's is not listed


def test_step_and_reconcile_messages_carry_their_group_and_timeout(settings):
    job = start([legacy_file("reef.txt", REEF)])
    (step_message,) = OrmQ.objects.all()
    assert (step_message.task["group"], step_message.task["timeout"]) == (
        "upgrade",
        settings.KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS,
    )
    message_id, args = step_until(job, JobStage.FINALIZING)
    OrmQ.objects.filter(id=message_id).delete()
    assert run_upgrade_step(*args) == "succeeded"
    (reconcile_message,) = [m for m in OrmQ.objects.all() if m.task["func"] == RECONCILE_FUNC]
    assert (reconcile_message.task["group"], reconcile_message.task["timeout"]) == (
        "upgrade-reconcile",
        rec.hard_timeout_seconds(),
    )
