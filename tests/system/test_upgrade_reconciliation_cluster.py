"""End to end on a real django-q2 cluster (ORM broker): the documents of an upgraded space compile
on the cluster, the reconcile delivery published after the success commit applies availability,
a recovery tick heals a job whose delivery was never published, and afterwards a disabled
document is not returned by a query while the space's gate is open."""

from __future__ import annotations

import time

import pytest
from django.db import connections
from django_q.brokers import get_broker
from django_q.cluster import Cluster
from django_q.tasks import async_task

from ingestion.models import Document, DocumentState
from knowledgefs.errors import Conflict
from knowledgefs.testing.upgrade_factories import Legacy, succeeded_job
from retrieval.modes import retrieve
from upgrades.models import UpgradeJob
from upgrades.services import reconciliation_runner as rec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def cluster():
    connections.close_all()  # no forked worker may inherit (and close) our connection
    running = Cluster(get_broker())
    running.start()
    yield running
    running.stop()


def _wait(predicate, what: str, seconds: float = 90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} did not happen in {seconds}s")


def test_cluster_reconciles_then_queries_skip_the_disabled_document(space, principal, cluster):
    from spaces.services import create_space

    job, token = succeeded_job(
        space,
        [
            Legacy("reef.txt", "Coral reef divers photograph parrotfish at dawn.", False),
            Legacy("dunes.txt", "Desert dunes migrate slowly with the prevailing wind."),
        ],
        enqueue=True,
    )
    other = create_space(principal, name="Second upgrade")
    lost, _ = succeeded_job(  # its worker died before issuing a lease: recovery's job
        other,
        [Legacy("moss.txt", "Moss grows on the north side of reef rocks.", False)],
        lease=False,
        enqueue=True,
    )
    _wait(
        lambda: Document.objects.filter(state=DocumentState.PUBLISHED).count() == 3,
        "compilation of the three documents",
    )
    with pytest.raises(Conflict) as gated:
        retrieve(space, "coral reef parrotfish", top_k=5)
    assert gated.value.code == "space_reconciliation_pending"

    assert rec.publish(job.id, token)  # what the run does after its success commit
    async_task(rec.RECOVERY_FUNCTION)  # one recovery tick, as the schedule would run it
    _wait(
        lambda: (
            UpgradeJob.objects.filter(
                id__in=[job.id, lost.id], reconcile_completed_at__isnull=False
            ).count()
            == 2
        ),
        "reconciliation of both jobs",
    )
    reef = Document.objects.get(space=space, filename="reef.txt")
    moss = Document.objects.get(space=other, filename="moss.txt")
    assert (reef.enabled, reef.row_version, moss.enabled) == (False, 2, False)
    files = [i.citation["filename"] for i in retrieve(space, "coral reef parrotfish dunes").items]
    assert files == ["dunes.txt"]
    assert retrieve(other, "moss north reef rocks").items == []
    assert UpgradeJob.objects.get(id=lost.id).reconcile_attempt_count == 1
