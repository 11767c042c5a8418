"""Durable jobs: claim-before-publish dispatch, fencing, the recovery sweep, retry and cancel."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from django_q.models import OrmQ, Schedule, Task

from ingestion.compilation import pipeline
from ingestion.compilation.dispatch import RECOVERY_SCHEDULE, TASK_FUNCTION, dispatch
from ingestion.compilation.errors import LeaseLost
from ingestion.compilation.failures import fail
from ingestion.compilation.leases import Held, _checkpoint, claim_many
from ingestion.compilation.operations import cancel_job, retry_job
from ingestion.compilation.publish import publish_many
from ingestion.compilation.recovery import drain_queued, recover_jobs
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact, Stage
from ingestion.projection import projector
from ingestion.tests.embed_faults import fail_embed_targets
from knowledgefs.errors import Conflict
from retrieval.backends import get_search_backend

pytestmark = pytest.mark.django_db

TEXT = ("Section one explains warranty claims for broken screens. " * 30).encode()


def _admit(space, data=TEXT, name="doc.txt", enqueue=False):
    return admit_document(space, filename=name, data=data, enqueue=enqueue)


def _job(job_id) -> CompilationJob:
    return CompilationJob.objects.get(id=job_id)


def _queued_messages() -> list[tuple]:
    """(job id, delivery id) of every message waiting in the ORM broker."""
    from django_q.signing import SignedPackage

    return [tuple(SignedPackage.loads(m.payload)["args"]) for m in OrmQ.objects.all()]


# --- dispatch -------------------------------------------------------------------------------


def test_dispatch_claims_before_it_enqueues(space):
    job_id = _admit(space).job.id
    delivery = dispatch(job_id)
    job = _job(job_id)
    assert delivery and job.task_id == delivery and job.dispatched_at is not None
    assert _queued_messages() == [(str(job_id), delivery)]
    # A second dispatch finds the claim and enqueues nothing.
    assert dispatch(job_id) is None
    assert len(_queued_messages()) == 1


def test_a_failed_enqueue_releases_the_claim(space, monkeypatch):
    job_id = _admit(space).job.id

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr("django_q.tasks.async_task", broker_down)
    assert dispatch(job_id) is None
    job = _job(job_id)
    assert (job.run_state, job.task_id, job.dispatched_at) == ("queued", "", None)


def test_a_delivery_starts_only_with_its_own_claim(space):
    job_id = _admit(space).job.id
    delivery = dispatch(job_id)
    assert pipeline.run_job(job_id, "not-the-claim") == "queued"  # a stray message
    assert _job(job_id).execution_attempts == 0
    assert pipeline.run_job(job_id, delivery) == "succeeded"
    # The same message delivered twice: exactly one did the work.
    assert pipeline.run_job(job_id, delivery) == "succeeded"
    assert _job(job_id).execution_attempts == 1


def test_two_concurrent_deliveries_of_one_attempt_do_the_work_once(space):
    job_id = _admit(space).job.id
    delivery = dispatch(job_id)
    first = claim_many({job_id: delivery}, "worker-a")
    second = claim_many({job_id: delivery}, "worker-b")
    assert list(first) == [job_id] and second == {}


# --- the recovery sweep ---------------------------------------------------------------------


def test_sweep_redelivers_an_attempt_claimed_but_never_delivered(space):
    job_id = _admit(space).job.id
    delivery = dispatch(job_id)
    OrmQ.objects.all().delete()  # the broker lost the message
    old = timezone.now() - timedelta(seconds=settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS + 1)
    CompilationJob.objects.filter(id=job_id).update(dispatched_at=old)
    report = recover_jobs()
    assert report.redispatched_undelivered == 1
    assert _job(job_id).task_id == delivery  # same claim: a delayed copy would work as well
    assert _queued_messages() == [(str(job_id), delivery)]
    assert recover_jobs().redispatched_undelivered == 0  # not again within grace
    assert pipeline.run_job(job_id, delivery) == "succeeded"
    assert pipeline.run_job(job_id, delivery) == "succeeded"  # the other copy: nothing
    assert _job(job_id).execution_attempts == 1


def test_sweep_dispatches_a_job_whose_claim_was_released(space):
    job_id = _admit(space).job.id
    CompilationJob.objects.filter(id=job_id).update(
        updated_at=timezone.now() - timedelta(seconds=30)
    )
    assert recover_jobs().dispatched == 1
    assert _job(job_id).task_id


def test_sweep_requeues_an_expired_lease_and_the_stale_worker_is_fenced(space):
    job_id = _admit(space).job.id
    pipeline.compile_jobs([job_id], until=Stage.NODES_GENERATED)  # the worker "dies"
    stale_token = _job(job_id).lease_token
    CompilationJob.objects.filter(id=job_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    report = recover_jobs()
    assert (report.requeued_expired, report.dispatched) == (1, 1)
    job = _job(job_id)
    assert (job.run_state, job.stage, job.lease_token) == ("queued", "nodes_generated", None)
    pipeline.run_job(job_id, job.task_id)
    job = _job(job_id)
    assert (job.run_state, job.execution_attempts) == ("succeeded", 2)
    nodes = KnowledgeNode.objects.filter(document_id=job.document_id).count()
    assert nodes == Document.objects.get().node_count
    assert get_search_backend().projection_counts(space.id) == {"keyword": nodes, "dense": nodes}
    # The stale worker wakes up: its checkpoint and its failure are refused.
    with pytest.raises(LeaseLost):
        _checkpoint(job_id, stale_token, stage=Stage.PROJECTION_BUILT)
    assert fail(job_id, stale_token, "late", "late failure") is False
    assert _job(job_id).run_state == "succeeded"


def test_a_job_whose_worker_keeps_dying_fails_with_a_reason(space):
    job_id = _admit(space).job.id
    for _ in range(settings.KNOWLEDGE_JOB_MAX_ATTEMPTS):
        CompilationJob.objects.filter(id=job_id).update(run_state="queued", task_id="")
        pipeline.compile_jobs([job_id], until=Stage.PARSED)
        CompilationJob.objects.filter(id=job_id).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
    report = recover_jobs()
    assert report.failed_expired == 1
    job = _job(job_id)
    assert (job.run_state, job.error_code) == ("failed", "worker_lost")
    assert f"stopped {settings.KNOWLEDGE_JOB_MAX_ATTEMPTS} times" in job.error_message
    assert Document.objects.get().state == "failed"


def test_an_expired_lease_of_a_timed_out_task_fails_instead_of_running_again(space):
    job_id = _admit(space).job.id
    delivery = dispatch(job_id)
    pipeline.compile_jobs({job_id: delivery}, until=Stage.PARSED)
    Task.objects.create(
        id=uuid.uuid4().hex,
        name=f"compile:{delivery}",
        func=TASK_FUNCTION,
        started=timezone.now(),
        stopped=timezone.now(),
        success=False,
        result="Task exceeded maximum timeout value (5 seconds)",
    )
    CompilationJob.objects.filter(id=job_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert recover_jobs().failed_expired == 1
    job = _job(job_id)
    assert (job.run_state, job.error_code) == ("failed", "timeout")


def test_a_due_retry_is_queued_again_and_resumes(space, monkeypatch):
    job_id = _admit(space).job.id

    def flaky(space_id):
        raise ConnectionError("model runtime unreachable")

    fail_embed_targets(monkeypatch, flaky)
    pipeline.compile_jobs([job_id])
    job = _job(job_id)
    assert (job.run_state, job.stage, job.error_retryable) == (
        "retry_wait",
        "nodes_generated",
        True,
    )
    backoff = settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS
    assert timedelta(seconds=backoff - 2) < job.next_attempt_at - timezone.now()
    assert recover_jobs().retries_due == 0  # not due yet
    monkeypatch.undo()
    assert recover_jobs(now=job.next_attempt_at + timedelta(seconds=1)).retries_due == 1
    job = _job(job_id)
    assert job.run_state == "queued" and job.task_id
    pipeline.run_job(job_id, job.task_id)
    assert _job(job_id).run_state == "succeeded"


def test_a_django_q_timeout_fails_the_held_jobs_as_timeout_and_stops_the_worker(space, monkeypatch):
    from django_q.exceptions import TimeoutException

    job_id = _admit(space).job.id

    def too_slow(space_id):
        raise TimeoutException("Task exceeded maximum timeout value (5 seconds)")

    monkeypatch.setattr(projector(), "targets", too_slow)
    with pytest.raises(TimeoutException):
        pipeline.compile_jobs([job_id])
    job = _job(job_id)
    assert (job.run_state, job.error_code) == ("failed", "timeout")


def test_the_sweep_schedule_exists_after_migrate_and_kfs_schedules_repairs_it(capsys):
    assert Schedule.objects.filter(
        name=RECOVERY_SCHEDULE, func="ingestion.tasks.recover_jobs"
    ).exists()
    Schedule.objects.all().delete()
    call_command("kfs", "schedules", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["func"] == "ingestion.tasks.recover_jobs" and shown["minutes"] >= 1
    assert Schedule.objects.filter(name=RECOVERY_SCHEDULE).count() == 1


# --- cancel ---------------------------------------------------------------------------------


def test_a_job_canceled_while_queued_never_starts(space):
    admission = _admit(space)
    delivery = dispatch(admission.job.id)
    canceled = cancel_job(admission.job.id)
    assert (canceled.run_state, canceled.stage) == ("canceled", "canceled")
    assert pipeline.run_job(admission.job.id, delivery) == "canceled"
    assert _job(admission.job.id).execution_attempts == 0
    assert Document.objects.get().state == "canceled"


def test_a_canceled_running_job_writes_nothing_more(space):
    job_id = _admit(space).job.id
    pipeline.compile_jobs([job_id], until=Stage.NODES_GENERATED)
    token = _job(job_id).lease_token
    cancel_job(job_id)
    assert KnowledgeNode.objects.count() == 0  # partial nodes removed with the cancel
    # The worker carries on with the token it held: nothing it does lands.
    held = Held({job_id: token})
    pipeline._compile_claimed(held, None)
    job = _job(job_id)
    assert (job.run_state, job.stage) == ("canceled", "canceled")
    assert KnowledgeNode.objects.count() == 0
    assert get_search_backend().projection_counts(space.id) == {"keyword": 0, "dense": 0}
    assert publish_many([(job, token, 10)]) == []


def test_cancel_of_a_finished_job_is_a_conflict(space):
    job_id = _admit(space).job.id
    pipeline.run_job(job_id)
    with pytest.raises(Conflict) as info:
        cancel_job(job_id)
    assert info.value.code == "job_finished"


# --- retry ----------------------------------------------------------------------------------


def test_manual_retry_resumes_from_the_parse_checkpoint(space, monkeypatch):
    job_id = _admit(space).job.id
    monkeypatch.setattr(settings, "KNOWLEDGE_JOB_MAX_ATTEMPTS", 1)

    def broken(space_id):
        raise ConnectionError("model runtime unreachable")

    monkeypatch.setattr(projector(), "targets", broken)
    pipeline.compile_jobs([job_id])
    failed = _job(job_id)
    assert (failed.run_state, failed.error_code) == ("failed", "embedding_unavailable")
    artifact = ParseArtifact.objects.get(job_id=job_id)  # kept for the retry
    monkeypatch.undo()
    attempt = retry_job(job_id)
    assert (attempt.stage, attempt.run_state, attempt.retry_of_id) == ("parsed", "queued", job_id)
    assert attempt.attempt_number == 2
    assert ParseArtifact.objects.get(id=artifact.id).job_id == attempt.id
    pipeline.run_job(attempt.id)
    attempt.refresh_from_db()
    assert attempt.run_state == "succeeded"
    assert attempt.execution_attempts == 1
    document = Document.objects.get()
    assert (document.state, document.active_generation) == ("published", attempt.id)


@pytest.mark.parametrize(
    ("state", "code"),
    [("queued", "job_live"), ("succeeded", "job_succeeded")],
)
def test_retry_of_a_live_or_published_job_is_a_conflict(space, state, code):
    job_id = _admit(space).job.id
    if state == "succeeded":
        pipeline.run_job(job_id)
    with pytest.raises(Conflict) as info:
        retry_job(job_id)
    assert info.value.code == code


# --- API and command line -------------------------------------------------------------------


def test_job_api_shows_progress_and_cancel_and_retry_work(client, space, api_key):
    job_id = _admit(space).job.id
    pipeline.compile_jobs([job_id], until=Stage.NODES_GENERATED)
    body = client.get(f"/v1/jobs/{job_id}").json()
    assert body["state"] == "nodes_generated" and body["run_state"] == "running"
    nodes = KnowledgeNode.objects.count()
    assert body["progress"]["nodes_total"] == nodes
    assert body["progress"]["nodes_embedded"] == 0
    assert body["progress"]["percent"] == 50
    response = client.delete(f"/v1/jobs/{job_id}")
    assert response.status_code == 200 and response.json()["state"] == "canceled"
    again = client.delete(f"/v1/jobs/{job_id}")
    assert again.status_code == 409 and again.json()["code"] == "job_finished"
    retried = client.post(f"/v1/jobs/{job_id}/retry", {"from": "start"}, format="json")
    assert retried.status_code == 202
    attempt = retried.json()
    assert attempt["retry_of"] == str(job_id) and attempt["stage"] == "queued"
    conflict = client.post(f"/v1/jobs/{job_id}/retry", {}, format="json")
    assert conflict.status_code == 409 and conflict.json()["code"] == "job_superseded"
    bad = client.post(f"/v1/jobs/{attempt['id']}/retry", {"from": "middle"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_retry_start"


def test_job_api_is_tenant_bound(space, db):
    from rest_framework.test import APIClient

    from spaces.api_keys import create_api_key

    job_id = _admit(space).job.id
    other = APIClient(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    for response in (
        other.get(f"/v1/jobs/{job_id}"),
        other.delete(f"/v1/jobs/{job_id}"),
        other.post(f"/v1/jobs/{job_id}/retry", {}, format="json"),
    ):
        assert response.status_code == 404 and response.json()["code"] == "job_not_found"
    assert _job(job_id).run_state == "queued"


def test_kfs_jobs_stats_cancel_and_retry(space, capsys):
    good = _admit(space, name="good.txt").job.id
    bad = _admit(space, data=b"\x00\x01\x02" * 100, name="bad.txt").job.id
    waiting = _admit(space, data=b"another document about tides " * 20, name="later.txt").job.id
    pipeline.compile_jobs([good, bad])
    args = ["--space", space.slug, "--tenant", space.tenant_id, "--json"]
    call_command("kfs", "jobs", *args)
    items = json.loads(capsys.readouterr().out)["items"]
    by_name = {i["filename"]: i for i in items}
    assert set(items[0]) >= {
        "id",
        "document_id",
        "filename",
        "state",
        "stage",
        "progress",
        "error_code",
    }
    assert by_name["good.txt"]["state"] == "published"
    assert by_name["good.txt"]["progress"]["percent"] == 100
    assert by_name["bad.txt"]["state"] == "failed" and by_name["bad.txt"]["error_code"]
    assert by_name["later.txt"]["state"] == "queued"
    call_command("kfs", "jobs", *args, "--state", "failed")
    assert [i["filename"] for i in json.loads(capsys.readouterr().out)["items"]] == ["bad.txt"]
    call_command("kfs", "cancel", str(waiting), "--json")
    assert json.loads(capsys.readouterr().out)["state"] == "canceled"
    call_command("kfs", "stats", *args)
    stats = json.loads(capsys.readouterr().out)
    nodes = KnowledgeNode.objects.filter(generation=good).count()
    assert stats == {
        "documents": {"published": 1, "failed": 1, "canceled": 1},
        "nodes": nodes,
        "jobs": {"published": 1, "failed": 1, "canceled": 1},
    }
    call_command("kfs", "retry", str(bad), "--json")
    retried = json.loads(capsys.readouterr().out)
    assert retried["state"] in ("queued", "parsed") and retried["attempt_number"] == 2


# --- bounded memory -------------------------------------------------------------------------


def test_a_batch_larger_than_the_retained_artifact_limit_runs_in_waves(
    space, settings, monkeypatch
):
    from ingestion import memory_gates

    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 1
    jobs = [
        _admit(space, data=f"wave document {n} about tides ".encode() * 40, name=f"{n}.txt").job.id
        for n in range(3)
    ]
    waves = []
    finish = pipeline._chunk_wave

    def spy(held, wave):
        holders = memory_gates.retained_artifact_gate().snapshot()["holders"]
        waves.append((len(wave), len(holders)))
        return finish(held, wave)

    monkeypatch.setattr(pipeline, "_chunk_wave", spy)
    pipeline.compile_jobs(jobs)
    assert waves == [(1, 1), (1, 1), (1, 1)]  # one retained artifact at a time
    assert set(CompilationJob.objects.values_list("run_state", flat=True)) == {"succeeded"}
    assert memory_gates.retained_artifact_gate().snapshot()["holders"] == []


def test_an_artifact_over_the_byte_budget_runs_alone(space, settings, monkeypatch):
    from ingestion import memory_gates

    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES = 32 * 1024  # below the 1 MiB floor
    big = ("A long paragraph about volcanoes and magma chambers. " * 20 + "\n\n") * 20
    assert len(big) * 2 > 32 * 1024
    jobs = [
        _admit(space, data=big.encode(), name="big.txt").job.id,
        _admit(space, data=b"a small note about tides " * 10, name="small.txt").job.id,
    ]
    waves = []
    finish = pipeline._chunk_wave
    monkeypatch.setattr(
        pipeline, "_chunk_wave", lambda h, w: (waves.append(len(w)), finish(h, w))[1]
    )
    pipeline.compile_jobs(jobs)
    assert waves == [1, 1]
    assert set(CompilationJob.objects.values_list("run_state", flat=True)) == {"succeeded"}
    assert memory_gates.retained_artifact_gate().snapshot()["holders"] == []


def test_job_list_api_filters_by_state_and_paginates(client, space):
    ids = [
        _admit(space, data=f"note {n} on tides ".encode() * 30, name=f"{n}.txt").job.id
        for n in range(3)
    ]
    pipeline.compile_jobs([ids[0]])  # only this one (run_job would take its siblings)
    response = client.get(f"/v1/knowledge-spaces/{space.id}/jobs?limit=2")
    assert response.status_code == 200
    page = response.json()
    assert [j["id"] for j in page["results"]] == [str(ids[2]), str(ids[1])]
    rest = client.get(page["next"]).json()
    assert [(j["id"], j["state"]) for j in rest["results"]] == [(str(ids[0]), "published")]
    only = client.get(f"/v1/knowledge-spaces/{space.id}/jobs?state=published").json()
    assert [j["id"] for j in only["results"]] == [str(ids[0])]
    bad = client.get(f"/v1/knowledge-spaces/{space.id}/jobs?state=stuck")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_state"


def test_drain_waits_for_a_due_retry(space, settings, monkeypatch):
    settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = 1
    job_id = _admit(space).job.id
    real = projector().targets
    calls = []

    def flaky_once(space_id):
        calls.append(space_id)
        if len(calls) == 1:
            raise ConnectionError("model runtime restarting")
        return real(space_id)

    fail_embed_targets(monkeypatch, flaky_once)
    drain_queued(space.id)
    job = _job(job_id)
    assert (job.run_state, job.execution_attempts, len(calls)) == ("succeeded", 2, 2)


def test_a_model_whose_window_cannot_be_resolved_fails_the_attempt_before_chunking(
    space, monkeypatch
):
    # Chunks are bounded by the embedding model's window: without it they could be cut too long
    # and truncated by the model, so the attempt is retried instead of chunking blind.
    job_id = _admit(space).job.id

    def down(space_id):
        raise ConnectionError("model runtime unreachable")

    monkeypatch.setattr(projector(), "targets", down)
    pipeline.compile_jobs([job_id])
    job = _job(job_id)
    assert (job.run_state, job.stage, job.error_code, job.error_retryable) == (
        "retry_wait",
        "parsed",
        "embedding_unavailable",
        True,
    )
    monkeypatch.undo()
    CompilationJob.objects.filter(id=job_id).update(run_state="queued", next_attempt_at=None)
    pipeline.compile_jobs([job_id])
    assert _job(job_id).run_state == "succeeded"
