"""Embedding faults through Dify: which failures a job retries, and whose documents they fail.

Everything is real: the database, the compiler, the Dify clients talking HTTP to the local
contract server (``knowledgefs/testing/dify_server.py``), whose scripted embedding provider
(``embedding_responder``) stands in for a provider that refuses a key, an invalid parameter or
one text.
"""

from __future__ import annotations

import pytest

from ingestion.compilation.recovery import drain_queued
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, DocumentState, KnowledgeNode, RunState
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
