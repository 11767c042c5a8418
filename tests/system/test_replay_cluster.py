"""A replay run on a real ``manage.py qcluster`` survives ``kill -9`` of the whole cluster
mid-run: the sweep (played by this process, as the schedule would) puts the run back, a new
cluster resumes it, and the items finished before the kill are neither run again nor doubled.

The cluster uses the hashing embedder of ``knowledgefs/testing/cluster_support.py`` with a query
delay, so each item takes a while and the kill lands between items."""

from __future__ import annotations

import time

import pytest

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from knowledgefs.testing.qcluster_process import QClusterProcess
from retrieval.golden import create_question
from retrieval.models import ReplayItem, ReplayRun
from retrieval.quality import replay, replay_dispatch
from spaces.services import Principal

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

QUESTIONS = 12
STALE = 5  # the smallest stale time the settings accept


@pytest.fixture(autouse=True)
def same_model_as_the_cluster(settings):
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }
    settings.KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS = STALE


def _wait(condition, seconds: float, sweep: bool = False):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if sweep:
            replay_dispatch.QUEUE.sweep()
        time.sleep(0.2)
    return None


def test_a_killed_replay_resumes_without_running_finished_items_again(
    space, object_storage, tmp_path
):
    text = "\n\n".join(f"Topic {n}: the tide table number {n * 7} is kept here." for n in range(12))
    admit_document(space, filename="tides.txt", data=text.encode(), enqueue=False)
    compile_all()
    for n in range(QUESTIONS):
        create_question(space, {"question": f"Which tide table is topic {n}?",
                                "expected_evidence": [{"text": f"Topic {n}:"}]})  # fmt: skip
    env = {"KFS_TEST_QUERY_DELAY": "0.7", "KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS": str(STALE)}
    log = tmp_path / "qcluster.log"
    first = QClusterProcess(object_storage, log, **env).start()
    try:
        run, _ = replay.create_run(
            Principal(tenant_id=space.tenant_id), space, {"selection": "all-active"}
        )
        done_before = _wait(
            lambda: (
                (n := ReplayItem.objects.filter(run=run).exclude(state="pending").count()) >= 3
                and n
            ),
            120,
        )
        assert done_before, f"the cluster finished no items: {log.read_text()[-2000:]}"
    finally:
        first.kill()
    finished = {
        i.ordinal: (i.completed_at, i.result)
        for i in ReplayItem.objects.filter(run=run).exclude(state="pending")
    }
    assert 3 <= len(finished) < QUESTIONS, finished.keys()
    assert ReplayRun.objects.get(id=run.id).state == "running"
    second = QClusterProcess(object_storage, log, **env).start()
    try:
        ended = _wait(
            lambda: ReplayRun.objects.get(id=run.id).state in ReplayRun.TERMINAL, 180, sweep=True
        )
    finally:
        second.kill()
    assert ended, f"the run did not end: {log.read_text()[-2000:]}"
    run.refresh_from_db()
    items = list(ReplayItem.objects.filter(run=run).order_by("ordinal"))
    assert [i.ordinal for i in items] == list(range(1, QUESTIONS + 1))  # no duplicate items
    assert all(i.state != "pending" for i in items)
    for item in items:  # finished before the kill: untouched by the resumed delivery
        if item.ordinal in finished:
            assert (item.completed_at, item.result) == finished[item.ordinal]
    assert run.attempt_count == 2, run.attempt_count
    assert run.summary["completed"] == QUESTIONS
    assert run.state in ("passed", "failed") and not run.error_code
