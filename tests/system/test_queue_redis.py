"""django-q2 on Redis (``KNOWLEDGE_QUEUE_BROKER=redis``): real redis-server, real qclusters.

Each cluster is a ``manage.py qcluster`` child process (``knowledgefs/testing/cluster_settings.py``,
the product's settings with the broker chosen by environment) with its own ``KNOWLEDGE_VAR_DIR``, so
two of them share nothing but the database and Redis, as two machines do. This process publishes
the messages (an upload's on-commit dispatch, the recovery sweep) through the same Redis.
Skipped without redis-server unless ``KFS_REQUIRE_REDIS=1``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django_q.models import OrmQ, Task

from ingestion.compilation.dispatch import TASK_FUNCTION
from ingestion.compilation.recovery import recover_jobs
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.queue_broker import parse_queue_broker, parse_queue_redis_url
from knowledgefs.testing.fixtures import upload
from knowledgefs.testing.qcluster_process import QClusterProcess
from knowledgefs.testing.redis_support import redis_url  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
QUEUE_KEY = "django_q:knowledgefs:q"  # django-q2's Redis list for the cluster name
TERMINAL = {"succeeded", "failed", "canceled"}


class QCluster(QClusterProcess):
    """``manage.py qcluster`` on the Redis broker, in its own process group; ``stop`` kills."""

    def __init__(self, name: str, tmp: Path, objects: Path, redis: str, **env: str) -> None:
        var = tmp / f"var-{name}"
        var.mkdir()
        self.embed_log = tmp / f"embed-{name}.log"
        super().__init__(
            objects,
            tmp / f"qcluster-{name}.log",
            **{
                "KFS_TEST_EMBED_LOG": str(self.embed_log),
                "KFS_TEST_WORKERS": "1",
                "KNOWLEDGE_VAR_DIR": str(var),
                "KNOWLEDGE_QUEUE_BROKER": "redis",
                "KNOWLEDGE_QUEUE_REDIS_URL": redis,
                **env,
            },
        )

    def embed_calls(self) -> int:
        return len(self.embed_log.read_text().splitlines()) if self.embed_log.exists() else 0

    stop = QClusterProcess.kill


@pytest.fixture(autouse=True)
def same_model_as_the_cluster(settings):
    """This process freezes the space's model and dimension: use the clusters' embedder."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


@pytest.fixture
def redis_broker(settings, monkeypatch, redis_url):  # noqa: F811
    """This process publishes to Redis as a process started with ``KNOWLEDGE_QUEUE_BROKER=redis``
    would: the settings' Q_CLUSTER and django-q2's Conf (read once at import) are switched."""
    import redis
    from django_q.conf import Conf

    url = parse_queue_redis_url("redis", queue_url=redis_url, shared_url="")
    settings.KNOWLEDGE_QUEUE_BROKER = "redis"
    settings.Q_CLUSTER = {
        **{k: v for k, v in settings.Q_CLUSTER.items() if k != "orm"},
        "redis": url,
    }
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", url)
    client = redis.from_url(url)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def clusters(object_storage, tmp_path, redis_url):  # noqa: F811
    started: list[QCluster] = []

    def start(name: str, **env: str) -> QCluster:
        cluster = QCluster(name, tmp_path, object_storage, redis_url, **env).start()
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


def _wait(condition, seconds: float, step: float = 0.2):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    return None


def _all_done(jobs) -> bool:
    ids = [j.id for j in jobs]
    return not CompilationJob.objects.filter(id__in=ids).exclude(run_state__in=TERMINAL).exists()


def test_a_document_compiles_end_to_end_through_redis(client, space, redis_broker, clusters):
    docs = {
        "volcano.md": b"# Volcanoes\n\nMagma chambers feed eruptions through volcanic vents.\n",
        "tides.txt": b"Ocean tides follow the gravitational pull of the moon and the sun.",
    }
    jobs = [upload(client, space, name, data).json()["job"]["id"] for name, data in docs.items()]
    # Claimed and published to Redis after the commit; nothing in the ORM queue.
    assert redis_broker.llen(QUEUE_KEY) == 2
    assert OrmQ.objects.count() == 0
    claims = dict(CompilationJob.objects.filter(id__in=jobs).values_list("id", "task_id"))
    assert all(len(task_id) == 32 for task_id in claims.values())

    cluster = clusters("a")
    states = _wait(
        lambda: (
            [client.get(f"/v1/jobs/{j}").json() for j in jobs]
            if _all_done(CompilationJob.objects.filter(id__in=jobs))
            else None
        ),
        90,
    )
    assert states, cluster.log.read_text()[-2000:]
    assert [(s["stage"], s["run_state"]) for s in states] == [("published", "succeeded")] * 2
    assert redis_broker.llen(QUEUE_KEY) == 0
    # The delivery that did the work is the one the claim published (django-q2's record is in
    # the database whatever the broker).
    first = Task.objects.filter(name=f"compile:{claims[CompilationJob.objects.get(id=jobs[0]).id]}")
    assert _wait(first.exists, 30)
    assert first.get().success and first.get().func == TASK_FUNCTION
    response = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests",
        {"query": "what pulls the ocean tides", "top_k": 1},
        format="json",
    )
    assert response.status_code == 200, response.json()
    (top,) = response.json()["items"]
    assert top["citation"]["filename"] == "tides.txt"
    assert "moon" in top["text"]


def test_two_clusters_share_the_queue_and_each_job_runs_once(space, redis_broker, clusters):
    # One document per delivery (no sibling adoption) and 0.3 s per embedded text, so the two
    # clusters (one worker each) both take work from the shared list.
    env = {"KNOWLEDGE_COMPILE_BATCH_DOCUMENTS": "1", "KFS_TEST_EMBED_DELAY": "0.3"}
    a, b = clusters("a", **env), clusters("b", **env)
    jobs = [
        admit_document(
            space,
            filename=f"doc-{n}.txt",
            data=f"Document {n}: tides, volcanoes and claim number {n}.".encode(),
        ).job
        for n in range(8)
    ]
    assert _wait(lambda: _all_done(jobs), 150), (
        list(CompilationJob.objects.values_list("run_state", "error_code")),
        a.log.read_text()[-2000:],
        b.log.read_text()[-2000:],
    )
    rows = CompilationJob.objects.filter(id__in=[j.id for j in jobs])
    assert sorted(rows.values_list("run_state", "execution_attempts")) == [("succeeded", 1)] * 8
    # Every published message was delivered exactly once (django-q2's monitor records a
    # delivery just after it returns), and both machines worked.
    deliveries = Task.objects.filter(func=TASK_FUNCTION)
    assert _wait(lambda: deliveries.count() >= 8, 30)
    assert sorted(deliveries.values_list("name", flat=True)) == sorted(
        f"compile:{task_id}" for task_id in rows.values_list("task_id", flat=True)
    )
    assert a.embed_calls() > 0 and b.embed_calls() > 0, (a.embed_calls(), b.embed_calls())
    assert (
        len({worker.rsplit(":", 1)[1] for worker in rows.values_list("worker_id", flat=True)}) == 2
    )
    for document in Document.objects.filter(space=space):
        assert document.state == "published"
        assert KnowledgeNode.objects.filter(document=document).count() == document.node_count == 1
    assert redis_broker.llen(QUEUE_KEY) == 0


def test_a_lost_message_is_published_again_by_the_sweep(space, redis_broker, clusters, settings):
    job = admit_document(space, filename="lost.txt", data=b"A message Redis lost.").job
    claimed = CompilationJob.objects.get(id=job.id)
    assert claimed.run_state == "queued" and claimed.task_id
    assert redis_broker.llen(QUEUE_KEY) == 1
    redis_broker.delete(QUEUE_KEY)  # lost: e.g. Redis restarted without persistence

    cluster = clusters("a")
    time.sleep(3)  # the cluster is up and idle: nothing arrives
    assert CompilationJob.objects.get(id=job.id).run_state == "queued"

    # Within the dispatch grace the sweep leaves the claim alone (the message may be late).
    assert recover_jobs().redispatched_undelivered == 0
    later = timezone.now() + timedelta(seconds=settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS + 1)
    report = recover_jobs(now=later)
    assert report.redispatched_undelivered == 1
    assert _wait(lambda: _all_done([job]), 60), cluster.log.read_text()[-2000:]
    done = CompilationJob.objects.get(id=job.id)
    assert (done.run_state, done.execution_attempts, done.task_id) == (
        "succeeded",
        1,
        claimed.task_id,  # re-published under the same delivery id
    )
    recorded = Task.objects.filter(name=f"compile:{claimed.task_id}", success=True)
    assert _wait(recorded.exists, 30) and recorded.count() == 1


def test_a_lost_research_task_message_is_claimed_again_by_the_sweep(
    client, space, redis_broker, clusters, settings
):
    from retrieval.research_tasks import dispatch as research
    from retrieval.tests.test_research_tasks import TASKS, load

    load(space)  # compiled in this process with the clusters' embedder
    created = client.post(
        TASKS, {"space_id": str(space.id), "query": "rockets vs bread", "top_k": 2}, format="json"
    )
    assert created.status_code == 202, created.json()
    task_id = created.json()["id"]
    assert redis_broker.llen(QUEUE_KEY) == 1
    redis_broker.delete(QUEUE_KEY)  # the message is lost

    cluster = clusters("a")
    later = timezone.now() + timedelta(
        seconds=settings.KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS + 1
    )
    report = research.sweep(now=later)
    assert (report.undelivered_reclaimed, report.dispatched) == (1, 1)

    def finished():
        body = client.get(f"{TASKS}/{task_id}").json()
        return body if body["status"] in {"completed", "failed", "canceled"} else None

    body = _wait(finished, 90)
    assert body, cluster.log.read_text()[-2000:]
    assert (body["stage"], body["status"], body["error"]) == ("completed", "completed", None)
    assert {i["citation"]["filename"] for i in body["result"]["items"]} == {
        "rockets.txt",
        "bread.txt",
    }
    assert body["progress"]["attempts"] == 1


# --- start-up checks of the setting (no Redis needed) --------------------------------------------


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    ("broker", "queue_url", "shared_url", "message"),
    [
        ("redis", "", "", "KNOWLEDGE_QUEUE_BROKER=redis needs KNOWLEDGE_QUEUE_REDIS_URL"),
        ("orm", "redis://r:6379/1", "", "KNOWLEDGE_QUEUE_REDIS_URL is set but"),
        (
            "redis",
            "http://user:secret@r:6379/1",
            "",
            "KNOWLEDGE_QUEUE_REDIS_URL='http://***@r:6379/1' is not a Redis URL",
        ),
        ("redis", "", "redis://r:99999/0", "REDIS_URL='redis://r:99999/0' has an invalid port"),
    ],
)
def test_a_wrong_broker_setting_is_refused_with_its_name(broker, queue_url, shared_url, message):
    with pytest.raises(ImproperlyConfigured) as refused:
        parse_queue_redis_url(broker, queue_url=queue_url, shared_url=shared_url)
    assert str(refused.value).startswith(message)
    assert "secret" not in str(refused.value)


@pytest.mark.django_db(transaction=False)
def test_broker_names_and_url_defaults():
    assert parse_queue_broker("") == "orm" and parse_queue_broker(" Redis ") == "redis"
    with pytest.raises(ImproperlyConfigured, match="KNOWLEDGE_QUEUE_BROKER='sqs' is not one of"):
        parse_queue_broker("sqs")
    assert parse_queue_redis_url("orm", queue_url="", shared_url="redis://r/0") == ""
    assert (
        parse_queue_redis_url("redis", queue_url="", shared_url="redis://r:6379/2")
        == "redis://r:6379/2?socket_connect_timeout=5&socket_timeout=15"
    )
    assert (
        parse_queue_redis_url("redis", queue_url="rediss://q/1?socket_timeout=30", shared_url="x")
        == "rediss://q/1?socket_timeout=30&socket_connect_timeout=5"
    )
