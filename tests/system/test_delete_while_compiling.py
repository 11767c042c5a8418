"""BC-42: deleting a document, or its whole space, while a real worker is still compiling it.

A real ``manage.py qcluster`` (``knowledgefs/testing/cluster_settings.py``) compiles a 30-chunk
TXT holding ``ORPHAN-CANARY-42`` with a slow embedder (0.5 s per chunk). Three seconds into the
embedding the document (or the space) is deleted through the API. The delete fences the job:
its lease token is cleared, so every later write of the worker (a checkpoint, the projections,
the publication) finds the job no longer its own and writes nothing. After the worker stopped:
no node, no dense vector, no keyword-index document (the SQLite tantivy index is read directly),
no hit for the canary, and the job reads ``canceled`` (``document_deleted``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.qcluster_process import QClusterProcess
from retrieval.backends import get_search_backend
from retrieval.models import DenseVector

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CANARY = "ORPHAN-CANARY-42"
DELAY = 0.5  # seconds per embedded chunk


@pytest.fixture(autouse=True)
def same_model_as_the_cluster(settings):
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


@pytest.fixture
def cluster(object_storage, tmp_path):
    log = tmp_path / "embed.log"
    process = QClusterProcess(
        object_storage,
        tmp_path / "qcluster.log",
        KFS_TEST_EMBED_DELAY=str(DELAY),
        KFS_TEST_EMBED_LOG=str(log),
    )
    yield process, log
    process.kill()


def _admit(space) -> CompilationJob:
    paragraphs = [
        f"Paragraph {p} of the depot ledger: crates, pallets and forklift slot {p}. " * 9
        for p in range(30)
    ]
    paragraphs[17] = f"{CANARY} " + paragraphs[17]
    text = "\n\n".join(paragraphs)
    return admit_document(space, filename="ledger.txt", data=text.encode()).job


def _wait(condition, seconds: float, step: float = 0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    return None


def _embedding_started(job) -> bool:
    row = CompilationJob.objects.filter(id=job.id).values_list("stage", flat=True).first()
    return row == "nodes_generated"


def _calls(log: Path) -> list[int]:
    """Texts per embedding call the worker finished so far."""
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def _quiet(log: Path, seconds: float) -> None:
    """Wait until the embedder has made no call for ``seconds`` (the worker stopped)."""

    def lines() -> int:
        return len(_calls(log))

    last, since = lines(), time.monotonic()
    while time.monotonic() - since < seconds:
        time.sleep(0.25)
        now = lines()
        if now != last:
            last, since = now, time.monotonic()


def _assert_nothing_left(space_id, document_id) -> None:
    assert not KnowledgeNode.objects.filter(document_id=document_id).exists()
    assert not KnowledgeNode.objects.filter(space_id=space_id).exists()
    assert not DenseVector.objects.filter(space_id=space_id).exists()
    assert get_search_backend().projection_counts(space_id) == {"keyword": 0, "dense": 0}


def test_bc42_deleting_a_document_while_it_is_embedded_leaves_nothing(space, client, cluster):
    process, log = cluster
    job = _admit(space)
    process.start()
    assert _wait(lambda: _embedding_started(job), 90), CompilationJob.objects.get(id=job.id).stage
    time.sleep(3)
    assert CompilationJob.objects.get(id=job.id).run_state == "running"
    response = client.delete(f"/v1/knowledge-spaces/{space.id}/documents/{job.document_id}")
    assert response.status_code == 204, response.content
    # Counted once the delete committed (on a loaded machine the delete itself can take longer
    # than a batch): from then on at most the batch in flight ends.
    embedded_before = len(_calls(log))
    _quiet(log, 6)  # a batch in flight (8 × 0.5 s) ends, then nothing more
    # The worker stopped within one batch of the delete instead of embedding all 30 chunks.
    calls = _calls(log)
    assert sum(calls[embedded_before:]) <= 8, calls
    assert not Document.objects.filter(id=job.document_id).exists()
    # The job the delete canceled stays readable; its document is gone.
    shown = client.get(f"/v1/jobs/{job.id}")
    assert shown.status_code == 200, shown.content
    assert (shown.json()["state"], shown.json()["error_code"]) == ("canceled", "document_deleted")
    assert shown.json()["document_id"] is None
    _assert_nothing_left(space.id, job.document_id)
    found = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests", {"query": CANARY}, format="json"
    )
    assert found.status_code == 200 and found.json()["items"] == [], found.content
    # The space goes on working: the same bytes uploaded again are compiled and found.
    again = _admit(space)
    assert _wait(
        lambda: CompilationJob.objects.filter(id=again.id, run_state="succeeded").exists(), 120
    ), CompilationJob.objects.get(id=again.id).run_state


def test_bc42_deleting_the_space_while_it_compiles_leaves_nothing(space, client, cluster):
    process, log = cluster
    job = _admit(space)
    process.start()
    assert _wait(lambda: _embedding_started(job), 90), CompilationJob.objects.get(id=job.id).stage
    time.sleep(3)
    response = client.delete(f"/v1/knowledge-spaces/{space.id}")
    assert response.status_code in (200, 202, 204), response.content
    _quiet(log, 6)
    assert not CompilationJob.objects.filter(id=job.id).exists()
    _assert_nothing_left(space.id, job.document_id)
