"""Lock order on PostgreSQL: interleavings that once deadlocked.

Skipped on SQLite, whose IMMEDIATE transactions serialise writers.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from ingestion.compilation import leases
from ingestion.compilation.operations import cancel_job
from ingestion.compilation.pipeline import compile_jobs
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, KnowledgeNode, Stage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _admit(space, n):
    data = f"document {n} about tides and claims. ".encode() * 40
    return admit_document(space, filename=f"{n}.txt", data=data, enqueue=False).job


def _run(targets):
    errors = []

    def wrap(fn):
        def inner():
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connections.close_all()

        return inner

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL lock semantics")


def test_two_deliveries_adopting_each_other_do_not_deadlock(space, monkeypatch):
    x, y = _admit(space, 1).id, _admit(space, 2).id
    barrier = threading.Barrier(2, timeout=10)
    calls = threading.local()
    real = leases.lease_seconds

    def lease_seconds():  # called per job just before its UPDATE: line both threads up
        calls.n = getattr(calls, "n", 0) + 1
        if calls.n == 2:
            try:  # with rows taken in id order the other delivery waits on our first row
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return real()

    monkeypatch.setattr(leases, "lease_seconds", lease_seconds)
    won = {}
    errors = _run(
        [
            lambda: won.update(a=leases.claim_many({x: None, y: None}, "a")),  # run_job(x)
            lambda: won.update(b=leases.claim_many({y: None, x: None}, "b")),  # run_job(y)
        ]
    )
    assert errors == [], errors
    assert sorted(map(str, [*won["a"], *won["b"]])) == sorted([str(x), str(y)])


def test_claim_and_cancel_of_the_same_job_do_not_deadlock(space, monkeypatch):
    job = _admit(space, 1)
    job_locked = threading.Event()

    class State:  # evaluated after the job UPDATE, before the document UPDATE in claim_many
        QUEUED, FAILED, CANCELED, PUBLISHED = "queued", "failed", "canceled", "published"

        @property
        def PROCESSING(self):  # noqa: N802
            job_locked.set()
            time.sleep(1.0)  # cancel locks the document and waits for the job row
            return "processing"

    monkeypatch.setattr(leases, "DocumentState", State())

    def cancel():
        job_locked.wait(10)
        cancel_job(job.id)

    errors = _run([lambda: leases.claim_many({job.id: None}, "w"), cancel])
    assert errors == [], errors


def test_a_stage_commit_and_a_cancel_do_not_deadlock(space, monkeypatch):
    job = _admit(space, 1)
    entered = threading.Event()
    manager = KnowledgeNode.objects
    real_bulk = manager.bulk_create

    def bulk_create(objs, **kw):  # inside _commit: the job row is locked FOR UPDATE
        entered.set()
        time.sleep(1.0)  # cancel locks the document and waits for the job row
        return real_bulk(objs, **kw)

    monkeypatch.setattr(manager, "bulk_create", bulk_create)
    deadlocks = []
    import logging

    class Catch(logging.Handler):
        def emit(self, record):
            if record.exc_info and "deadlock" in str(record.exc_info[1]).lower():
                deadlocks.append(record.getMessage())

    handler = Catch()
    logging.getLogger("knowledgefs.compilation").addHandler(handler)

    def cancel():
        entered.wait(10)
        cancel_job(job.id)

    try:
        errors = _run([lambda: compile_jobs([job.id]), cancel])
    finally:
        logging.getLogger("knowledgefs.compilation").removeHandler(handler)
    assert errors == [] and deadlocks == [], (errors, deadlocks)
    assert CompilationJob.objects.get(id=job.id).run_state == "canceled"


def test_a_projection_commit_and_a_cutover_do_not_deadlock(space, settings, monkeypatch):
    from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A, MODEL_B
    from retrieval import index_builds, index_projection, index_versions

    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    index_versions.change_embedding_model(space, MODEL_A)
    job = _admit(space, 1)
    compile_jobs([job.id], until=Stage.NODES_GENERATED)
    CompilationJob.objects.filter(id=job.id).update(run_state="queued", task_id="")
    building = index_versions.change_embedding_model(space, MODEL_B)  # its rebuild is not run here
    entered = threading.Event()
    real_check = index_versions._check_dimension

    def check(version, matrix):  # inside index_projections: the version rows are locked
        entered.set()
        time.sleep(1.0)  # the cutover locks the space row and waits for the version rows
        return real_check(version, matrix)

    monkeypatch.setattr(index_projection, "_check_dimension", check)

    def cut():
        entered.wait(10)
        index_builds.cutover(building.id)

    errors = _run([lambda: compile_jobs([job.id]), cut])
    assert errors == [], errors
    assert CompilationJob.objects.get(id=job.id).run_state == "succeeded"
