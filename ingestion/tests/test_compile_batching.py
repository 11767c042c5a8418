"""Per-wave batching of compilation's job writes and gate round trips (no timings here).

The statements and ledger transactions a delivery issues must grow with its waves, not with its
documents, and every batched write must still be fenced by each job's own lease token. Speed is
measured in bench/compile_overhead.py and bench/compile_profile.py (docs/benchmarks.md).
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingestion import memory_gates
from ingestion.compilation import waves
from ingestion.compilation.embed_step import _embedding_lengths
from ingestion.compilation.leases import Held, _checkpoint_many, claim_many, heartbeat
from ingestion.compilation.operations import cancel_job
from ingestion.compilation.parse_step import _parse
from ingestion.compilation.pipeline import compile_jobs
from ingestion.compilation.progress import _progress
from ingestion.compilation.publish import publish_many
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, DocumentRevision, KnowledgeNode, Stage

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_ledgers(settings, tmp_path):
    """Each test gets its own gate ledgers, so the counts below are this test's alone."""
    settings.VAR_DIR = tmp_path / "var"
    settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = 4
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 2


def _admit(space, n: int):
    data = f"Note {n} on tides, harbours and the warranty of boats. ".encode() * 12
    return admit_document(space, filename=f"{n}.txt", data=data, enqueue=False).job.id


def _job(job_id) -> CompilationJob:
    return CompilationJob.objects.get(id=job_id)


_TABLE = re.compile(r'(?:FROM|INTO|UPDATE)\s+"?([a-z_0-9]+)"?', re.IGNORECASE)


def _kind(sql: str) -> str:
    """A statement's verb and table; job UPDATEs are split by what they are for."""
    verb = sql.split(None, 1)[0].upper()
    match = _TABLE.search(sql)
    table = match.group(1) if match else "?"
    if verb == "UPDATE" and table == "ingestion_compilationjob":
        if '"started_at"' in sql:
            return "claim"
        if '"execution_attempts"' in sql:
            return "start"
        if '"stage"' in sql:
            return "checkpoint"
        return "heartbeat"
    return f"{verb} {table}"


def _tickets(name: str) -> int:
    """How many acquisitions a gate's ledger has admitted or queued (its ticket counter)."""
    gate = memory_gates.MachineSemaphore(name, 1)
    if not gate.ledger_path.exists():
        return 0
    return json.loads(gate.ledger_path.read_text())["next_ticket"] - 1


def test_a_delivery_issues_statements_and_gate_transactions_per_wave_not_per_document(space):
    n, waves = 12, 3  # 4 retained artifacts per wave
    ids = [_admit(space, i) for i in range(n)]
    with CaptureQueriesContext(connection) as captured:
        compile_jobs(ids)
    assert {_job(j).run_state for j in ids} == {"succeeded"}
    kinds = collections.Counter(_kind(q["sql"]) for q in captured.captured_queries)

    # Per document by design: the claim's compare-and-set (row by row in id order, so two
    # deliveries cannot deadlock) and the start of work (lease check + attempt counter).
    assert kinds["claim"] == n
    assert kinds["start"] == n
    # Per wave: the parsed and chunked checkpoints, each one UPDATE with every job's progress;
    # per group: the projection and the publish checkpoints.
    assert kinds["checkpoint"] == 2 * waves + 2, kinds
    assert kinds["INSERT ingestion_parseartifact"] == waves
    assert kinds["INSERT ingestion_knowledgenode"] == waves
    # Publishing the group: documents locked once, updated once (the claim updates them once).
    assert kinds["SELECT ingestion_document"] == 1
    assert kinds["UPDATE ingestion_document"] == 2
    assert kinds["DELETE ingestion_parseartifact"] == 1
    # Read once per wave or group, not per document: the space's chunking (the chunk bounds,
    # per wave, and once more at the embed step), its profile (a text-only profile builds no
    # visual projection) and the artifacts' image assets (none here, so none is described and
    # nothing is written over their empty report; the second read is publication's cleanup).
    assert kinds["SELECT spaces_knowledgespace"] == waves + 1, kinds
    assert kinds["SELECT spaces_spaceprofile"] == 2, kinds
    assert kinds["SELECT ingestion_parseartifact"] == 2, kinds
    assert kinds["UPDATE ingestion_parseartifact"] == 0, kinds
    # Gates: one materialization slot per wave, one retained-artifact lease per document (its
    # charge is only known once it is parsed).
    assert _tickets(memory_gates.MATERIALIZATION_GATE) == waves
    assert _tickets(memory_gates.RETAINED_ARTIFACT_GATE) == n
    assert memory_gates.retained_artifact_gate().snapshot()["holders"] == []
    assert memory_gates.materialization_gate().snapshot()["holders"] == []


def test_a_heartbeat_is_three_statements_and_fenced_per_job(space):
    ids = [_admit(space, i) for i in range(10)]
    tokens = claim_many(ids, "w")
    stale = ids[3]
    CompilationJob.objects.filter(id=stale).update(lease_token=uuid.uuid4())  # re-issued
    before = _job(stale)
    progress = {
        j: _progress("embedding", "e", 50 + i, nodes_total=10, nodes_embedded=i)
        for i, j in enumerate(ids[:6])
    }
    with CaptureQueriesContext(connection) as captured:
        still = heartbeat(tokens, progress=progress)
    statements = [q["sql"] for q in captured.captured_queries]
    assert len([s for s in statements if s.split()[0] in ("UPDATE", "SELECT")]) == 3, statements

    assert still == set(ids) - {stale}
    for i, j in enumerate(ids[:6]):
        job = _job(j)
        if j == stale:
            continue
        assert job.progress["nodes_embedded"] == i and job.progress_percent == 50 + i
    for j in ids[6:]:
        assert _job(j).progress.get("phase") != "embedding"
    after = _job(stale)  # the stale token changed nothing on its job
    assert (after.progress, after.progress_percent, after.lease_expires_at, after.heartbeat_at) == (
        before.progress,
        before.progress_percent,
        before.lease_expires_at,
        before.heartbeat_at,
    )


def test_a_batched_checkpoint_skips_a_job_whose_token_is_stale(space):
    ids = [_admit(space, i) for i in range(4)]
    tokens = claim_many(ids, "w")
    stale = ids[1]
    CompilationJob.objects.filter(id=stale).update(lease_token=uuid.uuid4())
    before = _job(stale).progress
    with CaptureQueriesContext(connection) as captured:
        done = _checkpoint_many(
            tokens,
            stage=Stage.PARSED,
            per_job={"progress": {j: {"phase": "parsed", "n": i} for i, j in enumerate(ids)}},
        )
    writes = [q for q in captured.captured_queries if q["sql"].startswith(("UPDATE", "SELECT"))]
    assert len(writes) == 2  # one locked read, one UPDATE
    assert done == set(ids) - {stale}
    for i, j in enumerate(ids):
        job = _job(j)
        if j == stale:
            assert (job.stage, job.progress) == ("queued", before)
        else:
            assert (job.stage, job.progress) == ("parsed", {"phase": "parsed", "n": i})


def test_a_batched_publish_skips_a_stale_or_canceled_job_and_costs_the_same_for_more_jobs(space):
    ids = [_admit(space, i) for i in range(8)]
    compile_jobs(ids, until=Stage.PROJECTION_BUILT)
    jobs = {j: _job(j) for j in ids}
    stale, canceled = ids[4], ids[6]
    CompilationJob.objects.filter(id=stale).update(lease_token=uuid.uuid4())
    cancel_job(canceled)

    def publish(job_ids):
        items = [(jobs[j], jobs[j].lease_token, 3) for j in job_ids]
        with CaptureQueriesContext(connection) as captured:
            published = publish_many(items)
        return published, len(captured.captured_queries)

    assert publish(ids[:1])[0] == ids[:1]  # creates the space's publication head
    small, small_count = publish(ids[1:3])
    large, large_count = publish(ids[3:])
    assert small == ids[1:3]
    assert large == [j for j in ids[3:] if j not in (stale, canceled)]
    assert large_count == small_count  # 5 jobs (two of them refused) cost what 2 cost

    for j in ids[:3] + large:
        document = Document.objects.get(id=jobs[j].document_id)
        assert (document.active_generation, document.node_count, document.state) == (
            j,
            3,
            "published",
        )
        assert (_job(j).run_state, _job(j).progress["nodes_total"]) == ("succeeded", 3)
    stale_job = _job(stale)
    assert (stale_job.run_state, stale_job.stage) == ("running", Stage.PROJECTION_BUILT)
    assert Document.objects.get(id=jobs[stale].document_id).active_generation is None
    assert KnowledgeNode.objects.filter(generation=stale).exists()  # nothing of it removed
    assert _job(canceled).run_state == "canceled"


def test_starting_work_counts_one_attempt_and_refuses_a_lost_lease(space):
    a, b = _admit(space, 1), _admit(space, 2)
    held = Held(claim_many([a, b], "w"))
    CompilationJob.objects.filter(id=b).update(lease_token=uuid.uuid4())
    assert held.start(a, _progress("parsing", "p", 5)) is True
    assert held.start(a) is True  # the same delivery again: no second attempt
    assert held.start(b) is False
    assert (_job(a).execution_attempts, _job(a).progress["phase"]) == (1, "parsing")
    assert _job(b).execution_attempts == 0 and b in held.lost


def test_a_wave_still_waits_for_the_materialization_gate(space, settings, monkeypatch):
    settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = 1
    ids = [_admit(space, i) for i in range(3)]
    parsed_at: list[float] = []
    real = _parse

    def parse(job, *args):
        parsed_at.append(time.monotonic())
        return real(job, *args)

    monkeypatch.setattr(waves, "_parse", parse)
    slot = memory_gates.materialization_gate().acquire()  # another worker is parsing
    released_at: list[float] = []

    def other_worker():
        gate = memory_gates.materialization_gate()
        deadline = time.monotonic() + 30
        while not gate.snapshot()["waiters"] and time.monotonic() < deadline:
            time.sleep(0.01)  # until our wave queues for the lane
        released_at.append(time.monotonic())
        slot.release()

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        compile_jobs(ids)
    finally:
        thread.join(30)
    assert released_at and len(parsed_at) == 3 and min(parsed_at) > released_at[0]
    assert {_job(j).run_state for j in ids} == {"succeeded"}


def test_a_heavy_document_after_light_ones_takes_its_own_lanes(space, monkeypatch):
    ids = [_admit(space, i) for i in range(3)]
    heavy = _job(ids[1]).revision  # a job is routed by the revision it compiles
    heavy_size = heavy.size_bytes + 1  # the same bytes, told apart by their recorded size
    DocumentRevision.objects.filter(id=heavy.id).update(size_bytes=heavy_size)
    monkeypatch.setattr(memory_gates, "is_heavy", lambda mime, size: size == heavy_size)
    seen = {}
    real = _parse

    def parse(job, *args):
        main = len(memory_gates.materialization_gate().snapshot()["holders"])
        heavy = memory_gates.MachineSemaphore(
            memory_gates.MATERIALIZATION_HEAVY_GATE, 1
        ).snapshot()["holders"]
        seen[job.id] = (main, len(heavy))
        return real(job, *args)

    monkeypatch.setattr(waves, "_parse", parse)
    compile_jobs(ids)
    # The light documents share one main-lane slot; the heavy one holds the heavy lane and a
    # main-lane slot of its own, the shared one having been given back first (lock order).
    assert seen == {ids[0]: (1, 0), ids[1]: (1, 1), ids[2]: (1, 0)}
    assert {_job(j).run_state for j in ids} == {"succeeded"}


def test_release_all_gives_leases_back_in_one_ledger_transaction(monkeypatch):
    gate = memory_gates.MachineSemaphore("batch-test", 8)
    leases = [gate.acquire(10) for _ in range(5)]
    opened = []
    real = memory_gates._locked_ledger

    def counting(lock_path, ledger_path):
        opened.append(ledger_path)
        return real(lock_path, ledger_path)

    monkeypatch.setattr(memory_gates, "_locked_ledger", counting)
    memory_gates.release_all([*leases, None])
    assert len(opened) == 1
    assert all(lease.released for lease in leases)
    assert gate.snapshot()["holders"] == []
    later = gate.acquire(10)
    leases[0].release()  # already released: must not take the later holder's slot
    del leases
    assert [h["ticket"] for h in gate.snapshot()["holders"]] == [later.ticket]
    later.release()


def test_embedding_batches_are_sorted_by_the_models_word_pieces(space, monkeypatch):
    from knowledgefs.runtime import get_embedding_model

    model = get_embedding_model()
    # Character length and word pieces disagree: digits and symbols split into many pieces.
    texts = [
        "tides " * 30,
        "Β-2 α7 ε4 ζ9 κ3 λ5 μ8 π6 σ1 ω0 " * 12,
        "harbour boats " * 10,
        "x" * 50,
    ]
    ids = [
        admit_document(space, filename=f"{i}.txt", data=t.encode(), enqueue=False).job.id
        for i, t in enumerate(texts)
    ]
    calls: list[list[str]] = []
    real = model.embed_documents

    def spy(batch):
        calls.append(list(batch))
        return real(batch)

    monkeypatch.setattr(model, "embed_documents", spy)
    compile_jobs(ids)
    assert {_job(j).run_state for j in ids} == {"succeeded"}
    streamed = [text for batch in calls for text in batch]
    counts = model.token_counts(streamed)
    assert counts == sorted(counts)
    assert [len(t) for t in streamed] != sorted(len(t) for t in streamed)  # not by characters
    assert _embedding_lengths(object(), ["ab", "c"]) == [2, 1]  # no counter: chars


def test_a_failed_read_of_the_image_assets_leaves_each_job_to_its_own_step(space, monkeypatch):
    ids = [_admit(space, i) for i in range(3)]

    def unreadable(job_ids):
        raise RuntimeError("the artifacts could not be read")

    monkeypatch.setattr("ingestion.enrichment.without_images", unreadable)
    compile_jobs(ids)
    assert {_job(j).run_state for j in ids} == {"succeeded"}
