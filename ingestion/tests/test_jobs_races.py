"""Races and bounds of the job machinery found in review; each test once failed."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_q.models import OrmQ

from ingestion import memory_gates
from ingestion.compilation import pipeline, recovery, waves
from ingestion.compilation.dispatch import dispatch
from ingestion.compilation.leases import heartbeat
from ingestion.compilation.operations import cancel_job
from ingestion.compilation.parse_step import _parse
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, ParseArtifact, Stage

pytestmark = pytest.mark.django_db

TEXT = ("Section one explains warranty claims for broken screens. " * 30).encode()


def _admit(space, data=TEXT, name="doc.txt"):
    return admit_document(space, filename=name, data=data, enqueue=False)


def _job(job_id):
    return CompilationJob.objects.get(id=job_id)


# 1. Gate lock-order inversion: a wave holds retained leases while it blocks on the
#    materialization gate; another worker holds a materialization slot while it blocks on the
#    retained gate.
def test_a_wave_never_waits_for_materialization_while_holding_retained_leases(
    space, settings, monkeypatch
):
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 1
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 2  # heavy lane: 1 slot
    monkeypatch.setattr(memory_gates, "is_heavy", lambda mime, size: True)  # e.g. two PDFs
    a = _admit(space, name="a.txt").job.id
    b = _admit(space, data=b"another note about tides " * 40, name="b.txt").job.id
    other: dict = {}
    real_retain = waves._retain

    def other_worker():  # another worker process starting its own wave (see _materialize)
        with memory_gates.materialization_slot(True):
            # production: no timeout
            lease = memory_gates.retained_artifact_gate().acquire(0, timeout=8)
            other["admitted"] = lease is not None
            if lease:
                lease.release()

    def retain(held, job_id, gate, charge, block):
        lease = real_retain(held, job_id, gate, charge, block)
        if job_id == a and "thread" not in other:
            other["thread"] = threading.Thread(target=other_worker)
            other["thread"].start()
            heavy = memory_gates.MachineSemaphore(memory_gates.MATERIALIZATION_HEAVY_GATE, 1)
            while not heavy.snapshot()["waiters"]:  # it queues for the heavy lane we hold
                time.sleep(0.01)
        return lease

    monkeypatch.setattr(waves, "_retain", retain)
    started = time.monotonic()
    pipeline.compile_jobs([a, b])
    other["thread"].join()
    assert other["admitted"], (
        f"deadlock: broken only by the other worker's 8 s timeout "
        f"(compile took {time.monotonic() - started:.1f} s)"
    )


# 2. The artifact stays referenced (reverse one-to-one cache on the job) after its lease is gone.
def test_an_artifact_is_not_kept_alive_after_its_wave(space, settings, monkeypatch):
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 1
    jobs = [
        _admit(space, data=f"wave document {n} about tides ".encode() * 40, name=f"{n}.txt").job.id
        for n in range(3)
    ]
    refs = []
    real_parse = _parse

    def parse(job, *args):
        artifact = real_parse(job, *args)
        refs.append(weakref.ref(artifact))
        return artifact

    alive = []
    finish = pipeline._chunk_wave

    def spy(held, wave):
        gc.collect()
        own = {id(w.artifact) for w in wave.values()}
        alive.append(sum(r() is not None and id(r()) not in own for r in refs))
        return finish(held, wave)

    monkeypatch.setattr(waves, "_parse", parse)
    monkeypatch.setattr(pipeline, "_chunk_wave", spy)
    pipeline.compile_jobs(jobs)
    # A wave holds its own leased artifact; nothing parsed in an earlier wave is still alive.
    assert len(alive) == 3 and alive == [0, 0, 0], alive


# 3. The sweep requeues a job whose lease was renewed after the sweep read it.
def test_the_sweep_does_not_requeue_a_lease_renewed_meanwhile(space, monkeypatch):
    job_id = _admit(space).job.id
    pipeline.compile_jobs([job_id], until=Stage.NODES_GENERATED)
    token = _job(job_id).lease_token
    CompilationJob.objects.filter(id=job_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    real = recovery._timeout_recorded

    def keeper_beats_now(task_id):  # the worker's keeper renews between read and write
        assert heartbeat({job_id: token}) == {job_id}
        return real(task_id)

    monkeypatch.setattr(recovery, "_timeout_recorded", keeper_beats_now)
    recovery.recover_jobs()
    job = _job(job_id)
    assert (job.run_state, job.lease_token) == ("running", token)


# 4. A heartbeat after a cancel writes nothing (the UPDATE itself is conditioned on the token).
def test_a_heartbeat_writes_nothing_after_a_cancel(space):
    job_id = _admit(space).job.id
    pipeline.compile_jobs([job_id], until=Stage.NODES_GENERATED)
    token = _job(job_id).lease_token
    cancel_job(job_id)
    assert heartbeat({job_id: token}) == set()
    assert heartbeat({job_id: token}, progress={job_id: {"percent": 99}}) == set()
    job = _job(job_id)
    assert job.run_state == "canceled"
    assert job.lease_expires_at is None and job.progress_percent != 99


# 5. A message still waiting in the broker is invalidated after the grace; with a backlog
#    longer than the grace the job is pushed to the back again and again.
def test_a_message_still_in_the_broker_is_not_invalidated_by_the_sweep(space):
    job_id = _admit(space).job.id
    first = dispatch(job_id)
    old = timezone.now() - timedelta(seconds=settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS + 1)
    CompilationJob.objects.filter(id=job_id).update(dispatched_at=old)
    recovery.recover_jobs()  # the message is still queued behind a long backlog
    assert OrmQ.objects.count() == 2
    assert pipeline.run_job(job_id, first) == "succeeded"


# 6. A document that kills its worker spends its own attempts, not its batch-mates'.
def test_a_poison_document_does_not_exhaust_the_attempts_of_its_batch(space, monkeypatch):
    poison = _admit(space, name="poison.txt").job.id
    innocent = _admit(space, data=b"an innocent note on tides " * 30, name="ok.txt").job.id
    real = _parse

    class Killed(BaseException):  # the worker dies while parsing the poison document
        pass

    def parse(job, *args):
        if job.id == poison:
            raise Killed
        return real(job, *args)

    monkeypatch.setattr(waves, "_parse", parse)
    for _ in range(settings.KNOWLEDGE_JOB_MAX_ATTEMPTS):
        CompilationJob.objects.filter(id=poison).update(run_state="queued", task_id="")
        with pytest.raises(Killed):
            pipeline.run_job(poison)
        CompilationJob.objects.filter(run_state="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        # An interrupt gives held jobs back; a real kill leaves them running until the sweep.
        recovery.recover_jobs()
    poisoned, job = _job(poison), _job(innocent)
    assert poisoned.execution_attempts == settings.KNOWLEDGE_JOB_MAX_ATTEMPTS
    assert job.execution_attempts <= 1 and job.run_state != "failed", (
        job.run_state,
        job.error_code,
        job.execution_attempts,
    )


# 7. A batch-mate canceled while it waits its turn still starts work (is_lost is cached 1 s).
def test_a_batch_mate_canceled_before_its_turn_never_parses(space, monkeypatch):
    a = _admit(space, name="a.txt").job.id
    b = _admit(space, data=b"another note about tides " * 40, name="b.txt").job.id
    parsed = []
    real = _parse

    def parse(job, *args):
        parsed.append(job.id)
        artifact = real(job, *args)
        if job.id == a:
            cancel_job(b)  # acknowledged before b's turn comes
        return artifact

    monkeypatch.setattr(waves, "_parse", parse)
    pipeline.compile_jobs([a, b])
    assert parsed == [a]


# 8. django-q2's timeout fails, terminally, batch-mates that never started.
def test_a_timeout_does_not_fail_batch_mates_that_never_started(space, settings, monkeypatch):
    from django_q.exceptions import TimeoutException

    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 1
    ids = [
        _admit(space, data=f"note {n} about tides ".encode() * 40, name=f"{n}.txt").job.id
        for n in range(3)
    ]

    def slow(held, jobs, job_ids, nodes):
        raise TimeoutException("Task exceeded maximum timeout value (5 seconds)")

    monkeypatch.setattr(pipeline, "_project", slow)
    with pytest.raises(TimeoutException):
        pipeline.compile_jobs(ids)

    # A delivery of several jobs gives them all back; each started one is then delivered alone.
    assert [_job(j).run_state for j in ids] == ["queued"] * 3
    assert {_job(j).error_code for j in ids} == {""}


@pytest.mark.django_db(transaction=True)
def test_a_hung_worker_stops_renewing_its_lease_and_the_sweep_takes_the_job_back(
    space, settings, monkeypatch
):
    settings.KNOWLEDGE_JOB_LEASE_SECONDS = 3  # the keeper renews every second
    settings.KNOWLEDGE_JOB_STALL_SECONDS = 1
    job_id = _admit(space).job.id
    release = threading.Event()
    real = _parse

    def hangs(job, *args):
        release.wait(30)  # a parser that never answers
        return real(job, *args)

    monkeypatch.setattr(waves, "_parse", hangs)
    worker = threading.Thread(target=lambda: pipeline.compile_jobs([job_id]))
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and recovery.recover_jobs().requeued_expired == 0:
            time.sleep(0.5)
        job = _job(job_id)
        assert (job.run_state, job.lease_token) == ("queued", None)
    finally:
        release.set()
        worker.join(30)
    # The hung worker woke up: everything it tried was refused; the job waits for its delivery.
    job = _job(job_id)
    assert job.run_state == "queued" and job.stage == "queued"
    assert not ParseArtifact.objects.filter(job_id=job_id).exists()


def test_a_batch_hands_back_what_it_cannot_start_in_half_the_worker_timeout(space, settings):
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 1  # one job per wave
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 0.001}  # spent after the first wave
    ids = [
        _admit(space, data=f"note {n} about tides ".encode() * 40, name=f"{n}.txt").job.id
        for n in range(3)
    ]
    pipeline.compile_jobs(ids)
    states = [(_job(j).run_state, bool(_job(j).task_id)) for j in ids]
    assert states[0][0] == "succeeded"
    assert states[1:] == [("queued", True), ("queued", True)]  # requeued and dispatched again
    assert OrmQ.objects.count() == 2


def test_a_replace_racing_a_delete_admits_the_bytes_as_a_new_document(space, principal):
    from ingestion import documents
    from ingestion.models import Document

    first = _admit(space, name="a.txt")
    real = documents._replace

    def deleted_meanwhile(existing, **kwargs):
        documents.delete_document(principal, space.id, existing.id)
        return real(existing, **kwargs)

    documents._replace = deleted_meanwhile
    try:
        again = admit_document(
            space, filename="b.txt", data=TEXT, on_duplicate="replace", enqueue=False
        )
    finally:
        documents._replace = real
    assert again.created and again.document.id != first.document.id
    assert list(Document.objects.values_list("filename", flat=True)) == ["b.txt"]


def test_kfs_ingest_wait_compiles_only_its_own_documents(space, tmp_path):
    from django.core.management import call_command

    other = _admit(space, name="someone-else.txt").job.id
    (tmp_path / "mine.md").write_text("# Mine\n\nTides follow the moon.\n")
    call_command(
        "kfs",
        "ingest",
        str(tmp_path),
        "--space",
        space.slug,
        "--tenant",
        space.tenant_id,
        "--wait",
        "--json",
    )
    assert _job(other).run_state == "queued"
    mine = CompilationJob.objects.exclude(id=other).get()
    assert mine.run_state == "succeeded"
