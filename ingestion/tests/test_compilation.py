"""The compilation service: idempotent deliveries, lease fencing, checkpoints, publication."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from ingestion.compilation.errors import LeaseLost
from ingestion.compilation.failures import fail
from ingestion.compilation.leases import Held, _checkpoint, claim, claim_many
from ingestion.compilation.pipeline import _compile_claimed, compile_jobs, run_job
from ingestion.compilation.publish import publish
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact, Stage
from ingestion.tests.embed_faults import fail_embed_targets
from retrieval.backends import get_search_backend
from retrieval.models import DenseVector
from retrieval.modes import retrieve
from spaces.models import PublicationHead

pytestmark = pytest.mark.django_db

TEXT = ("Section one explains warranty claims for broken screens. " * 30).encode()


def _admit(space, data=TEXT, name="doc.txt"):
    return admit_document(space, filename=name, data=data, enqueue=False)


def test_a_second_delivery_changes_nothing(space):
    admission = _admit(space)
    assert run_job(admission.job.id) == "succeeded"
    nodes = set(KnowledgeNode.objects.values_list("id", flat=True))
    head = PublicationHead.objects.get(space=space).revision
    assert run_job(admission.job.id) == "succeeded"
    assert set(KnowledgeNode.objects.values_list("id", flat=True)) == nodes
    assert PublicationHead.objects.get(space=space).revision == head
    assert CompilationJob.objects.get().execution_attempts == 1


def test_a_stale_lease_cannot_write(space):
    admission = _admit(space)
    token = claim(admission.job.id, "worker-a")
    assert token is not None
    assert claim(admission.job.id, "worker-b") is None  # not queued any more
    with pytest.raises(LeaseLost):
        _checkpoint(admission.job.id, uuid.uuid4(), stage=Stage.PARSED)
    assert fail(admission.job.id, uuid.uuid4(), "x", "late message") is False
    job = CompilationJob.objects.get()
    assert (job.stage, job.run_state, job.error_code) == ("queued", "running", "")


@pytest.mark.parametrize(
    "died_after", [Stage.PARSED, Stage.NODES_GENERATED, Stage.PROJECTION_BUILT]
)
def test_resuming_from_a_checkpoint_does_not_duplicate_work(space, died_after):
    admission = _admit(space)
    job_id = admission.job.id
    compile_jobs([job_id], until=died_after)  # the worker "dies" after this stage
    assert CompilationJob.objects.get(id=job_id).stage == died_after
    # Recovery re-queues it (the sweep of the durable-jobs work does this); a new delivery resumes.
    CompilationJob.objects.filter(id=job_id).update(run_state="queued", lease_token=None)
    run_job(job_id)
    job = CompilationJob.objects.get(id=job_id)
    assert (job.stage, job.run_state, job.execution_attempts) == ("published", "succeeded", 2)
    nodes = KnowledgeNode.objects.count()
    assert nodes > 1
    assert DenseVector.objects.count() == nodes
    assert ParseArtifact.objects.count() == 1
    assert Document.objects.get().node_count == nodes
    assert len(retrieve(space, "warranty claims broken screens", top_k=100).items) == nodes


def test_nodes_are_invisible_until_published(space):
    admission = _admit(space)
    compile_jobs([admission.job.id], until=Stage.PROJECTION_BUILT)
    job = CompilationJob.objects.select_related("document").get(id=admission.job.id)
    assert job.stage == Stage.PROJECTION_BUILT
    # Both projections exist, but the document's active generation is not this job yet.
    assert DenseVector.objects.exists()
    assert retrieve(space, "warranty claims", top_k=5).items == []
    publish(job, job.lease_token, node_count=KnowledgeNode.objects.count())
    assert retrieve(space, "warranty claims", top_k=5).items
    with pytest.raises(LeaseLost):
        publish(job, job.lease_token, node_count=1)  # already published: not ours


def test_recompiling_swaps_generations_in_one_step(space):
    admission = _admit(space)
    run_job(admission.job.id)
    old_nodes = set(KnowledgeNode.objects.values_list("id", flat=True))
    again = admit_document(
        space, filename="doc-v2.txt", data=TEXT, on_duplicate="replace", enqueue=False
    )
    assert retrieve(space, "warranty", top_k=1).items[0].citation["filename"] == "doc-v2.txt"
    run_job(again.job.id)
    new_nodes = set(KnowledgeNode.objects.values_list("id", flat=True))
    assert new_nodes and not (new_nodes & old_nodes)
    assert Document.objects.get().active_generation == again.job.id


def test_replacing_supersedes_a_job_that_has_not_run(space):
    first = _admit(space)
    second = admit_document(
        space, filename="b.txt", data=TEXT, on_duplicate="replace", enqueue=False
    )
    assert CompilationJob.objects.get(id=first.job.id).run_state == "superseded"
    assert run_job(first.job.id) == "superseded"
    assert run_job(second.job.id) == "succeeded"


def test_a_parse_failure_fails_only_its_document_in_a_batch(space):
    good = _admit(space, name="good.txt")
    bad = _admit(space, data=b"%PDF-1.4 garbage that is not a pdf", name="broken.pdf")
    compile_jobs([good.job.id, bad.job.id])
    assert Document.objects.get(id=good.document.id).state == "published"
    broken = Document.objects.get(id=bad.document.id)
    assert broken.state == "failed"
    assert broken.error_code in {"corrupt_pdf", "no_extractable_text"}
    assert CompilationJob.objects.get(id=bad.job.id).finished_at is not None


def _assert_projections_match_nodes(space):
    from retrieval.backends import get_search_backend

    nodes = KnowledgeNode.objects.filter(space=space).count()
    assert get_search_backend().projection_counts(space.id) == {"keyword": nodes, "dense": nodes}
    return nodes


def test_replacing_while_a_job_runs_leaves_no_orphans(space):
    first = _admit(space)
    compile_jobs([first.job.id], until=Stage.PROJECTION_BUILT)  # mid-run
    assert _assert_projections_match_nodes(space) > 0
    again = admit_document(
        space, filename="v2.txt", data=TEXT, on_duplicate="replace", enqueue=False
    )
    assert CompilationJob.objects.get(id=first.job.id).run_state == "superseded"
    assert _assert_projections_match_nodes(space) == 0  # the superseded attempt's output is gone
    stale = CompilationJob.objects.get(id=first.job.id)
    with pytest.raises(LeaseLost):  # the old worker wakes up: it owns nothing
        publish(stale, first.job.id, node_count=1)
    run_job(again.job.id)
    nodes = _assert_projections_match_nodes(space)
    assert nodes == Document.objects.get().node_count
    assert ParseArtifact.objects.count() == 1


def test_publishing_removes_every_other_generation(space):
    admission = _admit(space)
    run_job(admission.job.id)
    for n in range(2):
        again = admit_document(
            space, filename=f"v{n}.txt", data=TEXT, on_duplicate="replace", enqueue=False
        )
        run_job(again.job.id)
    assert set(KnowledgeNode.objects.values_list("generation", flat=True)) == {again.job.id}
    assert _assert_projections_match_nodes(space) == Document.objects.get().node_count


def test_an_error_outside_one_jobs_work_fails_the_whole_batch(space, monkeypatch):
    jobs = [
        _admit(space, data=f"document {n} ".encode() * 50, name=f"{n}.txt").job.id for n in range(3)
    ]

    def broken_model(space_id):
        raise RuntimeError("model files missing")

    fail_embed_targets(monkeypatch, broken_model)
    compile_jobs(jobs)
    # Retryable: every job of the batch waits to retry, none is left running.
    states = set(CompilationJob.objects.values_list("run_state", "error_code", "error_retryable"))
    assert states == {("retry_wait", "embedding_unavailable", True)}
    # The nodes_generated checkpoint is kept for the retry; nothing is projected or visible.
    assert set(CompilationJob.objects.values_list("stage", flat=True)) == {"nodes_generated"}
    assert get_search_backend().projection_counts(space.id) == {"keyword": 0, "dense": 0}
    # Attempts are bounded: the last one fails the jobs for good.
    for _ in range(settings.KNOWLEDGE_JOB_MAX_ATTEMPTS - 1):
        CompilationJob.objects.update(run_state="queued", next_attempt_at=None)
        compile_jobs(jobs)
    states = set(CompilationJob.objects.values_list("run_state", "error_code"))
    assert states == {("failed", "embedding_unavailable")}
    assert set(Document.objects.values_list("state", flat=True)) == {"failed"}
    assert "gave up after 3 attempts" in CompilationJob.objects.first().error_message
    assert KnowledgeNode.objects.count() == 0


def test_a_document_deleted_between_claim_and_work_does_not_strand_the_batch(space, principal):
    from ingestion.documents import delete_document

    keep = _admit(space, name="keep.txt")
    gone = _admit(space, data=b"short lived document text", name="gone.txt")
    tokens = claim_many([keep.job.id, gone.job.id], "w")
    delete_document(principal, space.id, gone.document.id)
    _compile_claimed(Held(tokens), None)
    assert CompilationJob.objects.get(id=keep.job.id).run_state == "succeeded"
    _assert_projections_match_nodes(space)


def test_the_projection_port_needs_a_registered_projector(monkeypatch):
    from ingestion import projection

    assert type(projection.projector()).__name__ == "SearchProjector"  # RetrievalConfig.ready()
    monkeypatch.setattr(projection, "_registered", None)
    with pytest.raises(RuntimeError, match="no projector is registered"):
        projection.projector()


def test_a_search_backend_failure_keeps_its_code_and_retry_class_through_the_port():
    from ingestion.compilation.errors import classify
    from ingestion.projection import ProjectionError
    from retrieval.backends import SearchBackendError

    error = SearchBackendError("the vector store is full", code="quota_exceeded", retryable=False)
    assert isinstance(error, ProjectionError)
    assert (error.status, error.code, error.retryable) == (503, "quota_exceeded", False)
    failure = classify(error)
    assert (failure.code, failure.message, failure.retryable) == (
        "quota_exceeded",
        "the vector store is full",
        False,
    )
