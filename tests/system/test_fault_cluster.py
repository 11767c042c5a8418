"""Fault tests against a real ``manage.py qcluster``: kill it, restart it, nothing is lost.

The cluster runs as a child process group on the test database
(``knowledgefs/testing/cluster_settings.py``) with a slow hashing embedder and a slow object read,
so a SIGKILL lands inside a stage. This test process plays the recovery schedule by calling the same
sweep the schedule runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings
from django_q.models import Task

from ingestion import parsing
from ingestion.chunking import chunk_elements
from ingestion.compilation.dispatch import ensure_recovery_schedule
from ingestion.compilation.recovery import recover_jobs
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, RunState
from knowledgefs.testing.qcluster_process import QClusterProcess
from retrieval.backends import get_search_backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 10  # the smallest lease the settings accept
TERMINAL = {"succeeded", "failed", "canceled"}


class QCluster(QClusterProcess):
    """A ``manage.py qcluster`` child with the smallest lease the settings accept."""

    def __init__(self, objects: Path, log: Path, **env: str) -> None:
        super().__init__(objects, log, **{"KNOWLEDGE_JOB_LEASE_SECONDS": str(LEASE), **env})


@pytest.fixture(autouse=True)
def same_model_as_the_cluster(settings):
    """This process freezes the space's model and dimension: use the cluster's embedder."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


@pytest.fixture
def clusters(object_storage, tmp_path):
    started: list[QCluster] = []

    def start(**env: str) -> QCluster:
        cluster = QCluster(object_storage, tmp_path / "qcluster.log", **env).start()
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.kill()


def _documents(space, count: int, paragraphs: int) -> list[CompilationJob]:
    jobs = []
    for n in range(count):
        text = "\n\n".join(
            f"Document {n} paragraph {p}: tides, volcanoes and claim number {n * 1000 + p}." * 8
            for p in range(paragraphs)
        )
        jobs.append(admit_document(space, filename=f"doc-{n}.txt", data=text.encode()).job)
    return jobs


def _expected_nodes(job: CompilationJob) -> int:
    """The node count a clean run produces: parse and chunk the same bytes here."""
    from knowledgefs import storage

    document = Document.objects.get(id=job.document_id)
    report = parsing.parse_with_report(
        storage.read_object(document.storage_key, max_bytes=document.size_bytes),
        document.mime_type,
    )
    return len(
        chunk_elements(
            report.elements,
            target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
            overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
        )
    )


def _wait(condition, seconds: float, step: float = 0.02, sweep: bool = False):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if sweep:
            recover_jobs()
        time.sleep(step)
    return None


def _assert_clean(space, jobs: list[CompilationJob], expected: dict) -> None:
    """Every document published once, with exactly the nodes and projections of a clean run."""
    for job in jobs:
        document = Document.objects.get(id=job.document_id)
        assert document.state == "published", (document.filename, document.error_message)
        nodes = KnowledgeNode.objects.filter(document=document)
        assert set(nodes.values_list("generation", flat=True)) == {document.active_generation}
        assert nodes.count() == expected[job.id] == document.node_count
    total = KnowledgeNode.objects.filter(space=space).count()
    assert get_search_backend().projection_counts(space.id) == {"keyword": total, "dense": total}
    assert not CompilationJob.objects.filter(
        space=space, run_state__in=["queued", "running", "retry_wait", "dispatch_pending"]
    ).exists()


@pytest.mark.parametrize("kill_at", ["queued", "parsed", "nodes_generated", "projection_built"])
def test_killing_the_cluster_inside_a_stage_loses_and_duplicates_nothing(space, clusters, kill_at):
    jobs = _documents(space, count=4, paragraphs=12)
    expected = {job.id: _expected_nodes(job) for job in jobs}
    order = ["queued", "parsed", "nodes_generated", "projection_built", "published"]
    reached = order[order.index(kill_at) :]

    def at_kill_point():
        running = CompilationJob.objects.filter(space=space, run_state="running")
        if kill_at == "nodes_generated":  # inside embedding: some vectors computed
            return any(
                (j.progress or {}).get("nodes_embedded") for j in running.filter(stage=kill_at)
            )
        if kill_at == "queued":  # claimed, materializing the source
            return running.filter(stage="queued").exists()
        return CompilationJob.objects.filter(space=space, stage__in=reached).exists()

    cluster = clusters(KFS_TEST_EMBED_DELAY="0.01", KFS_TEST_READ_DELAY="0.5")
    assert _wait(at_kill_point, 60), "the cluster never reached the kill point"
    cluster.kill()
    killed_at = time.monotonic()
    stuck = list(CompilationJob.objects.filter(space=space, run_state="running"))
    clusters(KFS_TEST_EMBED_DELAY="0.01")  # restart
    done = _wait(
        lambda: (
            not CompilationJob.objects.filter(space=space).exclude(run_state__in=TERMINAL).exists()
        ),
        LEASE + 90,
        step=0.5,
        sweep=True,
    )
    recovery = time.monotonic() - killed_at
    assert done, list(CompilationJob.objects.values_list("stage", "run_state", "error_code"))
    _assert_clean(space, jobs, expected)
    # A job killed while working was finished by a second delivery (attempts count work that
    # started; a batch-mate claimed but not started yet is not charged for the kill).
    for job in stuck:
        assert (
            CompilationJob.objects.get(id=job.id).execution_attempts == job.execution_attempts + 1
        )
    assert recovery < LEASE + 60


def test_cancel_during_embedding_stops_within_one_batch(space, clusters, tmp_path, client):
    log = tmp_path / "embed.log"
    (job,) = _documents(space, count=1, paragraphs=40)
    clusters(KFS_TEST_EMBED_DELAY="0.1", KFS_TEST_EMBED_LOG=str(log))
    assert _wait(
        lambda: (CompilationJob.objects.get(id=job.id).progress or {}).get("nodes_embedded"), 60
    )
    response = client.delete(f"/v1/jobs/{job.id}")
    acknowledged = time.time()
    assert response.status_code == 200 and response.json()["state"] == "canceled"
    time.sleep(4)  # a worker that kept going would embed ~40 more texts in this time
    calls = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    after = [texts for stamp, texts in calls if stamp > acknowledged]
    assert sum(after) <= settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE, calls
    job.refresh_from_db()
    assert (job.run_state, job.stage) == ("canceled", "canceled")
    assert KnowledgeNode.objects.filter(document_id=job.document_id).count() == 0
    assert get_search_backend().projection_counts(space.id) == {"keyword": 0, "dense": 0}


def test_a_task_over_its_timeout_fails_once_and_is_not_started_again(space, clusters):
    """BC-28: timeout 5 s, retry 10 s, max_attempts 1; a 22-second compilation."""
    (job,) = _documents(space, count=1, paragraphs=30)
    nodes = _expected_nodes(job)
    delay = 22 / nodes
    started = time.monotonic()
    clusters(KFS_TEST_EMBED_DELAY=f"{delay:.3f}", KFS_TEST_Q_TIMEOUT="5", KFS_TEST_Q_RETRY="10")
    failed = _wait(
        lambda: CompilationJob.objects.filter(id=job.id, run_state="failed").first(), 30, step=0.2
    )
    assert failed is not None, CompilationJob.objects.get(id=job.id).run_state
    assert failed.error_code == "timeout"
    assert time.monotonic() - started < 20
    time.sleep(12)  # past django-q2's retry window: no reincarnation
    job.refresh_from_db()
    assert (job.run_state, job.execution_attempts) == ("failed", 1)
    records = Task.objects.filter(name__startswith="compile:")
    assert [(t.success, "timeout" in str(t.result)) for t in records] == [(False, True)]
    assert Document.objects.get(id=job.document_id).state == "failed"


def test_the_cluster_runs_the_recovery_schedule_itself(space, clusters):
    from django.utils import timezone

    from ingestion.migrations import __name__ as _  # noqa: F401 - the package exists

    ensure_recovery_schedule()
    (job,) = _documents(space, count=1, paragraphs=2)
    # A worker died holding the job long ago; no message is queued for it.
    CompilationJob.objects.filter(id=job.id).update(
        run_state=RunState.RUNNING,
        lease_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=timezone.now() - timezone.timedelta(minutes=5),
        task_id="lost",
    )
    from django_q.models import OrmQ

    OrmQ.objects.all().delete()
    clusters()
    assert _wait(
        lambda: CompilationJob.objects.filter(id=job.id, run_state="succeeded").exists(),
        75,
        step=0.5,
    ), CompilationJob.objects.get(id=job.id).run_state


def test_kfs_ingest_follow_shows_the_cluster_compiling_until_done(
    space, clusters, tmp_path, capsys
):
    from io import StringIO

    from django.core.management import call_command

    folder = tmp_path / "docs"
    folder.mkdir()
    for n in range(3):
        (folder / f"{n}.md").write_text(f"# Note {n}\n\n" + "Tides follow the moon. " * 200)
    clusters(KFS_TEST_EMBED_DELAY="0.01")
    out = StringIO()
    call_command(
        "kfs",
        "ingest",
        str(folder),
        "--space",
        space.slug,
        "--tenant",
        space.tenant_id,
        "--follow",
        stdout=out,
    )
    states = set(Document.objects.filter(space=space).values_list("state", flat=True))
    assert states == {"published"}
    bar = capsys.readouterr().err  # tqdm draws on stderr
    assert "compile: 100%" in bar and "300/300" in bar
    assert out.getvalue().count("published") == 3
