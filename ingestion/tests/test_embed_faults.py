"""Embedding faults through Dify: which failures a job retries, and whose documents they fail.

Everything is real: the database, the compiler, the Dify clients talking HTTP to the local
contract server (``knowledgefs/testing/dify_server.py``), whose scripted embedding provider
(``embedding_responder``) stands in for a provider that refuses a key, an invalid parameter or
one text.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from ingestion.chunking import canonical_text
from ingestion.compilation.generations import _elements_from
from ingestion.compilation.pipeline import compile_jobs
from ingestion.compilation.recovery import drain_queued
from ingestion.documents import admit_document
from ingestion.models import (
    CompilationJob,
    Document,
    DocumentState,
    KnowledgeNode,
    ParseArtifact,
    RunState,
)
from ingestion.tokens import approx_tokens
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import TEST_INNER_KEY, TEXT_EMBEDDING
from retrieval.models import DenseVector
from spaces.services import create_space

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]

dify_server = dify_fixtures.dify_server

OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
SPACES = "/v1/knowledge-spaces"


@pytest.fixture
def dify(settings, dify_server):
    """Models through the contract server (``KNOWLEDGE_MODEL_RUNTIME=dify``), 48 dimensions."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = 1
    dify_server.dimension = 48
    return dify_server


@pytest.fixture
def ready_space(dify, client, principal):
    """A Dify space whose profile was validated by a first compiled document."""
    space = create_space(principal, name="Embedded through Dify")
    chosen = client.put(f"{SPACES}/{space.id}/embedding-profile", OPENAI, format="json")
    assert chosen.status_code == 200, chosen.content
    admit_document(space, filename="first.md", data=b"# First\n\nA first document.", enqueue=False)
    drain_queued(wait_for_retries=False)
    assert Document.objects.get(space=space).state == DocumentState.PUBLISHED
    dify.reset_observations()
    return space


def _documents(space, n: int, *, marker_in: int | None = None) -> list:
    admitted = []
    for i in range(n):
        body = f"# Report {i}\n\n" + f"Paragraph {i} about harbour cranes and tides. " * 40
        if i == marker_in:
            body += "\n\nPOISON-CHUNK the provider refuses this text."
        admitted.append(
            admit_document(space, filename=f"r{i}.md", data=body.encode(), enqueue=False)
        )
    return admitted


def _jobs(admitted) -> list[CompilationJob]:
    return [CompilationJob.objects.get(id=a.job.id) for a in admitted]


AUTH = "authentication failed"
NOT_FOUND = {"data": None, "error": "Model text-embedding-3-small not found"}


@pytest.mark.parametrize(
    ("answer", "code", "says"),
    [
        ((401, {"code": "unauthorized", "message": "bad key"}), "credential_invalid", AUTH),
        ((403, {"code": "forbidden", "message": "no"}), "credential_invalid", AUTH),
        ((400, {"code": "invalid_param", "message": "bad"}), "embedding_rejected", "answered 400"),
        ((200, NOT_FOUND), "embedding_rejected", "not found"),
    ],
)
def test_a_non_retryable_dify_error_fails_the_job_at_once(ready_space, dify, answer, code, says):
    admitted = _documents(ready_space, 2)
    dify.embedding_responder = lambda body: answer
    drain_queued(wait_for_retries=False)
    for job in _jobs(admitted):
        assert (job.run_state, job.error_code, job.error_retryable) == (
            RunState.FAILED,
            code,
            False,
        ), job.error_message
        assert job.execution_attempts == 1  # not through the retry policy
        assert says in job.error_message
        assert "gave up" not in job.error_message
    # Not retried inline. A refused key is sent once; a refusal that might be one text's fault
    # is tried once more per document (texts alone), never for every text.
    assert dify.count(TEXT_EMBEDDING) == (1 if code == "credential_invalid" else 1 + 2)
    assert not KnowledgeNode.objects.filter(document_id__in=[a.document.id for a in admitted])


def test_a_retryable_dify_error_still_goes_through_the_retry_policy(ready_space, dify):
    admitted = _documents(ready_space, 1)
    dify.embedding_responder = lambda body: (503, {"code": "busy", "message": "later"})
    drain_queued(wait_for_retries=False)
    (job,) = _jobs(admitted)
    assert (job.run_state, job.error_code, job.error_retryable) == (
        RunState.RETRY_WAIT,
        "embedding_unavailable",
        True,
    )


def test_one_documents_embedding_error_fails_only_that_document(ready_space, dify):
    admitted = _documents(ready_space, 4, marker_in=2)
    refused = []

    def provider(body):
        if any("POISON-CHUNK" in t for t in body["texts"]):
            refused.append(len(body["texts"]))
            return 400, {"code": "invalid_param", "message": "input rejected"}
        return None

    dify.embedding_responder = provider
    drain_queued(wait_for_retries=False)
    jobs = _jobs(admitted)
    # The batch holding the poisoned chunk held other documents' chunks too.
    assert refused and max(refused) > 1
    poisoned = jobs[2]
    assert (poisoned.run_state, poisoned.error_code, poisoned.error_retryable) == (
        RunState.FAILED,
        "embedding_rejected",
        False,
    )
    assert "chunk " in poisoned.error_message  # names the chunk the provider refused
    assert Document.objects.get(id=admitted[2].document.id).state == DocumentState.FAILED
    for i in (0, 1, 3):
        assert jobs[i].run_state == RunState.SUCCEEDED, (jobs[i].error_code, jobs[i].error_message)
        document = Document.objects.get(id=admitted[i].document.id)
        assert document.state == DocumentState.PUBLISHED
        assert DenseVector.objects.filter(node__document=document).count() == document.node_count
    assert not DenseVector.objects.filter(node__document_id=admitted[2].document.id).exists()


# --- BC-40: chunks within the model's token limit ------------------------------------------------

LIMIT = 512


def _token_limited(seen: list[int], *, refuse: str | None = None):
    """A provider counting tokens with KnowledgeFS's approximation, refusing (400) any request
    holding a text over 512 tokens, or holding ``refuse``."""

    def provider(body):
        counts = [approx_tokens(t) for t in body["texts"]]
        seen.extend(counts)
        if max(counts) > LIMIT or (refuse and any(refuse in t for t in body["texts"])):
            return 400, {"code": "invalid_param", "message": f"input too long: {max(counts)}"}
        return None

    return provider


def _bc40_documents(space) -> dict[str, object]:
    sentences = [
        f"Clause {n} of the supply contract binds the carrier to deliver crates on time."
        for n in range(600)
    ]
    paragraph = " ".join(sentences)[:45_000]
    cjk = "".join(chr(0x4E00 + (n * 7919) % 20_000) for n in range(6_000))
    rows = [f"| D-{n:03d} | {n * 37 % 9000:,} | 已盘点？是。 row {n} |" for n in range(600)]
    table = "\n".join(["| Depot | Units | Remark |", "| --- | --- | --- |", *rows])[:20_000]
    table = table[: table.rfind("\n")]
    files = {"paragraph.txt": paragraph, "cjk.txt": cjk, "table.md": "# Stock\n\n" + table}
    return {
        name: admit_document(space, filename=name, data=text.encode(), enqueue=False)
        for name, text in files.items()
    }


def _assert_nothing_truncated(admission) -> None:
    """The document's nodes cover every non-whitespace character of its canonical text."""
    artifact = ParseArtifact.objects.get(job_id=admission.job.id)
    text, _ = canonical_text(_elements_from(artifact))
    nodes = KnowledgeNode.objects.filter(generation=admission.job.id).order_by("start_offset")
    covered = 0
    for node in nodes:
        assert text[node.start_offset : node.end_offset] == node.text
        assert not text[covered : node.start_offset].strip(), (covered, node.start_offset)
        covered = max(covered, node.end_offset)
    assert not text[covered:].strip()


def test_bc40_no_embedding_request_exceeds_the_models_token_limit(ready_space, dify):
    seen: list[int] = []
    dify.embedding_responder = _token_limited(seen)
    admitted = _bc40_documents(ready_space)
    drain_queued(wait_for_retries=False)
    for name, admission in admitted.items():
        job = CompilationJob.objects.get(id=admission.job.id)
        assert job.run_state == RunState.SUCCEEDED, (name, job.error_code, job.error_message)
        _assert_nothing_truncated(admission)
    assert seen and max(seen) <= LIMIT, max(seen)
    # The CJK document and the table were cut further than characters alone would have cut.
    cjk = KnowledgeNode.objects.filter(generation=admitted["cjk.txt"].job.id)
    assert max(approx_tokens(n.text) for n in cjk) <= LIMIT
    assert cjk.count() >= 6_000 // LIMIT
    table = KnowledgeNode.objects.filter(generation=admitted["table.md"].job.id, kind="table")
    assert table.count() >= 2
    artifact = ParseArtifact.objects.get(job_id=admitted["table.md"].job.id)
    text, _ = canonical_text(_elements_from(artifact))
    for node in table:  # cut between rows only
        assert node.start_offset == 0 or text[node.start_offset - 1] == "\n", node.text[:40]
        assert node.end_offset == len(text) or text[node.end_offset] == "\n", node.text[-40:]


def test_bc40_a_chunk_the_provider_still_calls_too_long_fails_its_document_by_name(
    ready_space, dify
):
    seen: list[int] = []
    dify.embedding_responder = _token_limited(seen, refuse="Clause 321 ")
    admitted = _bc40_documents(ready_space)
    drain_queued(wait_for_retries=False)
    failed = CompilationJob.objects.get(id=admitted["paragraph.txt"].job.id)
    assert (failed.run_state, failed.error_code) == (RunState.FAILED, "embedding_rejected")
    assert "refused chunk" in failed.error_message and "paragraph.txt" in failed.error_message
    assert "input too long" in failed.error_message or "answered 400" in failed.error_message
    for name in ("cjk.txt", "table.md"):
        job = CompilationJob.objects.get(id=admitted[name].job.id)
        assert job.run_state == RunState.SUCCEEDED, (name, job.error_message)
    assert max(seen) <= LIMIT


# --- BC-41: a rate-limited provider -------------------------------------------------------------


class RateLimited:
    """A provider allowing 2 requests at once and 5 a second, answering 429 with
    ``Retry-After: 2`` beyond that; each accepted request takes 0.2 s. Records every answer and
    samples the jobs' progress while it answers."""

    def __init__(self, server, job_ids) -> None:
        self.server = server
        self.job_ids = job_ids
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.accepted: list[float] = []
        self.answers: list[tuple[float, str, int]] = []
        self.throttle_seen: set[str] = set()

    def __call__(self, body):
        now = time.monotonic()
        key = body["texts"][0]
        with self.lock:
            recent = [t for t in self.accepted if now - t < 1.0]
            if self.active >= 2 or len(recent) >= 5:
                self.answers.append((now, key, 429))
                return 429, {"code": "rate_limited", "message": "slow down"}, {"Retry-After": "2"}
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.accepted.append(now)
            self.answers.append((now, key, 200))
        try:
            for progress in CompilationJob.objects.filter(id__in=self.job_ids).values_list(
                "progress", flat=True
            ):
                if (progress or {}).get("throttled"):
                    self.throttle_seen.add(progress["operation"])
            time.sleep(0.2)
        finally:
            connection.close()
            with self.lock:
                self.active -= 1
        return None


def _forty_chunks(space, n: int):
    paragraphs = [
        f"Ledger {n} entry {p}: the harbour crane moved {p * 13} containers of grain. " * 12
        for p in range(40)
    ]
    data = "\n\n".join(paragraphs).encode()
    return admit_document(space, filename=f"ledger-{n}.txt", data=data, enqueue=False)


def _compile_each_in_its_own_worker(job_ids) -> None:
    """Three workers at once, each compiling one job (as three processes of a cluster would)."""

    def work(job_id):
        try:
            compile_jobs([job_id])
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(j,)) for j in job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)


@pytest.mark.django_db(transaction=True)
def test_bc41_a_rate_limited_provider_throttles_but_every_document_completes(
    ready_space, dify, settings
):
    settings.KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY = 2
    admitted = [_forty_chunks(ready_space, n) for n in range(3)]
    job_ids = [a.job.id for a in admitted]
    provider = RateLimited(dify, job_ids)
    dify.embedding_responder = provider
    started = time.monotonic()
    _compile_each_in_its_own_worker(job_ids)
    elapsed = time.monotonic() - started
    for job in _jobs(admitted):
        assert job.run_state == RunState.SUCCEEDED, (job.error_code, job.error_message)
        assert job.execution_attempts == 1  # throttling never failed an attempt
        document = Document.objects.get(id=job.document_id)
        assert document.node_count >= 40
    throttled = [a for a in provider.answers if a[2] == 429]
    assert throttled, "the provider's limit was never reached"
    # Per-provider concurrency is respected across the workers: never more than 2 at once.
    assert provider.peak <= 2 and dify.peak_in_flight(TEXT_EMBEDDING) <= 2
    # Each throttled request is sent again only after Retry-After, with jitter.
    gaps = []
    for at, key, _ in throttled:
        later = [t for t, k, _ in provider.answers if k == key and t > at]
        gaps.append(min(later) - at)
    assert min(gaps) >= 2.0, gaps
    assert max(gaps) <= 2 * 1.25 + 1.0, gaps  # jittered by at most a quarter (+ scheduling)
    # The jobs showed throttling while they waited, not a failure.
    assert any("throttled by the provider" in note for note in provider.throttle_seen)
    assert elapsed < 120


def _compile_each_in_its_own_process(job_ids) -> list[int]:
    """Three worker processes at once (forked from this one, so they share its settings and
    reach the same contract server and database), each compiling one job; their exit codes."""
    import multiprocessing
    import os

    from django.db import connections

    def work(job_id):
        code = 1
        try:
            compile_jobs([job_id])
            code = 0
        finally:
            connections.close_all()
            os._exit(code)  # no test-session teardown in the child

    connections.close_all()  # the children open their own connections
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=work, args=(j,)) for j in job_ids]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=150)
    return [worker.exitcode for worker in workers]


@pytest.mark.django_db(transaction=True)
def test_bc41_the_provider_concurrency_holds_across_worker_processes(ready_space, dify, settings):
    settings.KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY = 2
    admitted = [_forty_chunks(ready_space, n) for n in range(3)]
    job_ids = [a.job.id for a in admitted]
    provider = RateLimited(dify, job_ids)
    dify.embedding_responder = provider
    assert _compile_each_in_its_own_process(job_ids) == [0, 0, 0]
    for job in _jobs(admitted):
        assert job.run_state == RunState.SUCCEEDED, (job.error_code, job.error_message)
        assert job.execution_attempts == 1
    # Three processes, one machine-wide gate: never more than 2 requests at the provider, so
    # none was refused for concurrency (429s here come from the 5-a-second rate only).
    assert provider.peak <= 2 and dify.peak_in_flight(TEXT_EMBEDDING) <= 2
    assert len([a for a in provider.answers if a[2] == 200]) >= 3 * 40 // 16
    # The bound is the setting's: with 1 slot, one request at a time across the processes.
    settings.KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY = 1
    more = [_forty_chunks(ready_space, n) for n in range(3, 5)]
    provider = RateLimited(dify, [a.job.id for a in more])
    dify.embedding_responder = provider
    dify.reset_observations()
    assert _compile_each_in_its_own_process([a.job.id for a in more]) == [0, 0]
    assert all(job.run_state == RunState.SUCCEEDED for job in _jobs(more))
    assert provider.peak == 1 and dify.peak_in_flight(TEXT_EMBEDDING) == 1


@pytest.mark.django_db(transaction=True)
def test_bc41_a_bad_key_fails_every_document_at_once_without_retries(ready_space, dify):
    admitted = [_forty_chunks(ready_space, n) for n in range(3)]
    dify.embedding_responder = lambda body: (401, {"code": "unauthorized", "message": "bad key"})
    _compile_each_in_its_own_worker([a.job.id for a in admitted])
    for job in _jobs(admitted):
        assert (job.run_state, job.error_code, job.execution_attempts) == (
            RunState.FAILED,
            "credential_invalid",
            1,
        )
        assert "authentication failed" in job.error_message
    assert dify.count(TEXT_EMBEDDING) == 3  # one request per worker, none retried
