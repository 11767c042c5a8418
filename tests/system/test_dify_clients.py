"""Contract tests of the Dify inner-API clients against the local server
(knowledgefs/testing/dify_server.py).

Every client speaks real HTTP to a real threaded server; faults are switched on in the server,
never by replacing our code. Timing assertions leave a margin of one second for a busy machine;
each test has a hard pytest-timeout so a hang fails instead of stalling the run.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from django.core.exceptions import SuspiciousFileOperation
from django.core.files.base import ContentFile

from knowledgefs.dify.datasources import DifyDatasources
from knowledgefs.dify.embedding_model import DifyEmbeddingModel
from knowledgefs.dify.envelope import parse_json
from knowledgefs.dify.errors import (
    DatasourceError,
    DifyNotConfigured,
    EmbeddingDimensionMismatch,
    ModelRuntimeError,
    ObjectStorageError,
    StorageNotFound,
)
from knowledgefs.dify.frames import FrameDecoder, encode_frame
from knowledgefs.dify.model_runtime import DifyModelRuntime, MultimodalDocument, RerankHit
from knowledgefs.dify.object_storage import DifyObjectStorage
from knowledgefs.dify.redaction import sanitize_message
from knowledgefs.dify.transport import DifyTransport
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import (
    DATASOURCE,
    LLM,
    LLM_ANSWER,
    MODEL_CATALOG,
    MULTIMODAL_EMBEDDING,
    OBJECT,
    OBJECTS,
    RERANK,
    TEST_INNER_KEY,
    TEXT_EMBEDDING,
    StoredObject,
    checksum,
    hashed_embedding,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

# The server fixtures (a started DifyTestServer, a fast-retrying transport on it).
dify_server = dify_fixtures.dify_server
dify_transport = dify_fixtures.dify_transport

ROOT = Path(__file__).resolve().parents[2]
OPENAI = "langgenius/openai/openai"
COHERE = "langgenius/cohere/cohere"
DRIVE = "langgenius/google_drive/google_drive"
NOTION = "langgenius/notion/notion"
MiB = 1024 * 1024
MARGIN = 1.0  # seconds allowed over a configured timeout


def runtime(transport, **options) -> DifyModelRuntime:
    return DifyModelRuntime(transport=transport, **options)


def embed(client: DifyModelRuntime, texts, **options) -> np.ndarray:
    return client.embed_texts(
        tenant_id="tenant-a",
        provider=OPENAI,
        model="text-embedding-3-small",
        texts=texts,
        **options,
    )


def llm(client: DifyModelRuntime, prompt: str = "How many days of leave?"):
    return client.invoke_llm(
        tenant_id="tenant-a",
        provider=OPENAI,
        model="gpt-4.1-mini",
        prompt_messages=[{"role": "user", "content": prompt}],
        completion_params={"temperature": 0},
    )


def storage(transport, **options) -> DifyObjectStorage:
    return DifyObjectStorage(transport=transport, **options)


def elapsed(function) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        function()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


# --- configuration --------------------------------------------------------------------------


def test_a_transport_needs_a_url_and_a_key_and_never_shows_the_key():
    with pytest.raises(DifyNotConfigured, match="DIFY_INNER_API_URL"):
        DifyTransport("", TEST_INNER_KEY)
    with pytest.raises(DifyNotConfigured, match="DIFY_INNER_API_KEY"):
        DifyTransport("http://api:5001", " ")
    with pytest.raises(DifyNotConfigured) as caught:
        DifyTransport("http://admin:hunter2@api:5001", TEST_INNER_KEY)
    assert "hunter2" not in str(caught.value)
    for url in ("ftp://api:5001", "api:5001", "http://api:5001/?x=1", "http://api:notaport"):
        with pytest.raises(DifyNotConfigured):
            DifyTransport(url, TEST_INNER_KEY)
    transport = DifyTransport("http://api:5001/", TEST_INNER_KEY)
    assert transport.base_url == "http://api:5001"
    assert TEST_INNER_KEY not in repr(transport)


def test_clients_default_to_the_settings(settings, dify_server):
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.DIFY_MODEL_RUNTIME_TIMEOUT_MS = 4321
    settings.KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY = 3
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 1234
    client = DifyModelRuntime()
    assert (client.timeout_ms, client.concurrency) == (4321, 3)
    assert embed(client, ["hello"]).shape == (1, 64)
    assert DifyObjectStorage().timeout_ms == 1234


def _setup_django(**env: str) -> subprocess.CompletedProcess:
    import os

    names = (
        "DIFY_INNER_API_URL",
        "DIFY_MODEL_RUNTIME_TIMEOUT_MS",
        "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES",
        "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY",
        "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS",
    )
    environment = {k: v for k, v in os.environ.items() if k not in names}
    environment.update(DJANGO_SETTINGS_MODULE="knowledgefs.settings", **env)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "print(s.DIFY_INNER_API_URL, s.DIFY_MODEL_RUNTIME_TIMEOUT_MS, "
            "s.DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES, s.KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY, "
            "s.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS)",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dify_settings_defaults_and_ranges_are_checked_at_start_up():
    result = _setup_django(DIFY_INNER_API_URL="http://api:5001/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["http://api:5001", "60000", "8388608", "2", "60000"]
    for name, value, message in (
        ("KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY", "9", "outside the accepted range 1..8"),
        ("DIFY_MODEL_RUNTIME_TIMEOUT_MS", "600001", "outside the accepted range 100..600000"),
        ("DIFY_INNER_API_URL", "ftp://api", "must be an http:// or https:// URL"),
    ):
        result = _setup_django(**{name: value})
        assert result.returncode != 0
        assert f"{name}" in result.stderr and message in result.stderr


def test_a_refused_inner_key_is_not_retried(dify_server):
    transport = DifyTransport(dify_server.url, "a-wrong-inner-key-0000", backoff_base=0.01)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_REQUEST_REJECTED"
    assert caught.value.status == 401 and caught.value.retryable is False
    assert dify_server.count(TEXT_EMBEDDING) == 1
    assert "a-wrong-inner-key" not in str(caught.value)


def test_nothing_listening_is_unavailable_and_retryable():
    transport = DifyTransport("http://127.0.0.1:9", TEST_INNER_KEY, backoff_base=0.01)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(transport, timeout_ms=3000), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_UNAVAILABLE"
    assert caught.value.retryable is True
    assert "ConnectionRefusedError" in caught.value.message


# --- text embedding -------------------------------------------------------------------------


def test_embeddings_go_16_texts_per_request_and_come_back_in_order(dify_server, dify_transport):
    texts = [f"document {i} about topic{i % 5} and item{i}" for i in range(40)]
    vectors = embed(runtime(dify_transport), texts)
    assert vectors.shape == (40, 64) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    expected = np.array([hashed_embedding(t, 64) for t in texts], dtype=np.float32)
    assert np.allclose(vectors, expected, atol=1e-6)  # row i is text i
    calls = dify_server.calls(TEXT_EMBEDDING)
    assert sorted(len(c.body["texts"]) for c in calls) == [8, 16, 16]
    sent = [
        t
        for c in sorted(calls, key=lambda c: texts.index(c.body["texts"][0]))
        for t in c.body["texts"]
    ]
    assert sent == texts
    body = calls[0].body
    assert body["tenant_id"] == "tenant-a" and body["user_id"] == "knowledge-fs"
    assert body["provider"] == OPENAI and body["model"] == "text-embedding-3-small"
    assert body["model_type"] == "text-embedding" and body["input_type"] == "document"
    assert all(c.key_ok for c in calls)
    assert "credentials" not in json.dumps(body)


def test_at_most_two_embedding_requests_are_in_flight_per_call(dify_server, dify_transport):
    dify_server.delay(0.3, route=TEXT_EMBEDDING, times=None)
    texts = [f"text number {i}" for i in range(96)]  # 6 requests
    started = time.monotonic()
    vectors = embed(runtime(dify_transport, concurrency=2), texts)
    took = time.monotonic() - started
    assert vectors.shape == (96, 64)
    assert dify_server.count(TEXT_EMBEDDING) == 6
    assert dify_server.peak_in_flight(TEXT_EMBEDDING) == 2
    assert 0.85 <= took < 6 * 0.3  # three waves of two, not six one after another

    dify_server.reset_observations()
    embed(runtime(dify_transport, concurrency=1), texts[:48])
    assert dify_server.peak_in_flight(TEXT_EMBEDDING) == 1


def test_vectors_are_normalised_by_the_client(dify_server, dify_transport):
    dify_server.scale = 7.5
    vectors = embed(runtime(dify_transport), ["alpha beta", "gamma"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_a_wrong_dimension_is_a_mismatch_and_not_retried(dify_server, dify_transport):
    dify_server.add_fault("dimension", TEXT_EMBEDDING, dimension=32)
    with pytest.raises(EmbeddingDimensionMismatch) as caught:
        embed(runtime(dify_transport), ["hello"], expected_dimension=64)
    assert caught.value.code == "EMBEDDING_DIMENSION_MISMATCH"
    assert caught.value.retryable is False
    assert "32-d" in caught.value.message and "64-d" in caught.value.message
    assert dify_server.count(TEXT_EMBEDDING) == 1


def test_batches_of_one_call_must_agree_on_the_dimension(dify_server, dify_transport):
    dify_server.add_fault("dimension", TEXT_EMBEDDING, dimension=32, skip=1)
    with pytest.raises(EmbeddingDimensionMismatch, match=r"dimensions \[32, 64\]"):
        embed(runtime(dify_transport, concurrency=1), [f"t{i}" for i in range(20)])


def test_an_error_envelope_is_a_model_error_with_a_sanitized_message(dify_server, dify_transport):
    text = "Quarterly revenue of the Zebra project was 4.2 million"
    dify_server.add_fault(
        "envelope",
        TEXT_EMBEDDING,
        message=f"Incorrect API key provided: sk-live-9a8b7c6d5e4f3a2b1c0d. Input was: {text}. "
        f"api_key=plainsecret inner={TEST_INNER_KEY}",
    )
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), [text])
    error = caught.value
    assert error.code == "MODEL_RUNTIME_ERROR" and error.retryable is False
    assert dify_server.count(TEXT_EMBEDDING) == 1  # not retried
    message = str(error)
    for secret in ("sk-live-9a8b7c6d5e4f3a2b1c0d", "plainsecret", TEST_INNER_KEY, text, "Zebra"):
        assert secret not in message
    assert "Incorrect API key provided" in message and "[redacted]" in message


def test_null_data_is_a_model_error(dify_server, dify_transport):
    dify_server.add_fault("json", TEXT_EMBEDDING, status=200, body={"data": None, "error": ""})
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_ERROR"


@pytest.mark.parametrize(
    "body",
    [
        {"data": {"embeddings": [[0.1, 0.2]]}, "error": 7},  # error not a string
        {"data": {"embeddings": []}, "error": ""},  # no vector for the text
        {"data": {"embeddings": [[0.1, "x"]]}, "error": ""},
        {"data": {"embeddings": [[0.0, 0.0]]}, "error": ""},  # zero vector
        {"data": {"vectors": [[0.1]]}, "error": ""},
        ["not", "an", "envelope"],
    ],
)
def test_malformed_embedding_answers_are_invalid(dify_server, dify_transport, body):
    dify_server.add_fault("json", TEXT_EMBEDDING, status=200, body=body)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"
    assert caught.value.retryable is False


def test_non_json_answer_is_invalid(dify_server, dify_transport):
    dify_server.add_fault("oversize", TEXT_EMBEDDING, size=1000)  # a JSON prefix, cut short
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


def test_an_oversized_answer_stops_at_the_cap_before_parsing(dify_server, dify_transport):
    dify_server.add_fault("oversize", TEXT_EMBEDDING, size=64 * MiB)  # chunked, no length
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport, max_response_bytes=MiB), ["hello"])
    error = caught.value
    assert error.code == "MODEL_RUNTIME_RESPONSE_TOO_LARGE" and error.retryable is False
    assert error.bytes_read == MiB + 1  # never one byte more than needed to know
    assert dify_server.count(TEXT_EMBEDDING) == 1
    assert wait_until(lambda: dify_server.in_flight(TEXT_EMBEDDING) == 0)
    assert dify_server.calls(TEXT_EMBEDDING)[0].bytes_sent < 16 * MiB  # the rest was refused


def test_a_declared_oversized_answer_is_refused_unread(dify_server, dify_transport):
    dify_server.add_fault("oversize", TEXT_EMBEDDING, size=2 * MiB, declare=True)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport, max_response_bytes=MiB), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_TOO_LARGE"
    assert caught.value.bytes_read == 0


@pytest.mark.timeout(15)
def test_a_slow_answer_times_out_within_the_timeout(dify_server, dify_transport):
    dify_server.delay(10, route=TEXT_EMBEDDING)
    took, error = elapsed(lambda: embed(runtime(dify_transport, timeout_ms=500), ["hello"]))
    assert isinstance(error, ModelRuntimeError)
    assert error.code == "MODEL_RUNTIME_TIMEOUT" and error.retryable is True
    assert 0.45 <= took < 0.5 + MARGIN
    assert dify_server.count(TEXT_EMBEDDING) == 1  # a timeout spent the deadline: no retry


@pytest.mark.timeout(15)
def test_a_body_that_stalls_midway_times_out_within_the_timeout(dify_server, dify_transport):
    dify_server.add_fault("stall", TEXT_EMBEDDING, after_bytes=20, seconds=10)
    took, error = elapsed(lambda: embed(runtime(dify_transport, timeout_ms=700), ["hello"]))
    assert isinstance(error, ModelRuntimeError)
    assert error.code == "MODEL_RUNTIME_TIMEOUT" and error.retryable is True
    assert error.bytes_read == 20
    assert 0.65 <= took < 0.7 + MARGIN


@pytest.mark.timeout(20)
def test_the_deadline_holds_against_a_body_that_trickles_then_stalls(dify_server, dify_transport):
    # Every read returns within the read timeout until the stall; only the deadline (the
    # watchdog shutting the socket) ends the last read, which started with ~0.5 s left.
    dify_server.add_fault("trickle", TEXT_EMBEDDING, after_bytes=15, interval=0.1, seconds=10)
    took, error = elapsed(lambda: embed(runtime(dify_transport, timeout_ms=2000), ["hello"]))
    assert isinstance(error, ModelRuntimeError) and error.code == "MODEL_RUNTIME_TIMEOUT"
    assert error.bytes_read == 15
    assert 1.95 <= took < 2.0 + 0.7


def test_5xx_twice_then_success_is_retried_twice(dify_server, dify_transport):
    dify_server.fail_next(2, status=503, route=TEXT_EMBEDDING)
    vectors = embed(runtime(dify_transport), ["hello", "world"])
    assert vectors.shape == (2, 64)
    assert [c.status for c in dify_server.calls(TEXT_EMBEDDING)] == [503, 503, 200]


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 504])
def test_every_retryable_status_is_retried(dify_server, dify_transport, status):
    dify_server.fail_next(1, status=status, route=RERANK)
    hits = runtime(dify_transport).rerank(
        tenant_id="t", provider=COHERE, model="rerank-v3.5", query="a", docs=["a", "b"]
    )
    assert hits[0] == RerankHit(index=0, score=1.0)
    assert dify_server.count(RERANK) == 2


def test_retries_stop_after_two_and_keep_the_status(dify_server, dify_transport):
    dify_server.fail_next(10, status=503, route=TEXT_EMBEDDING)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_UNAVAILABLE"
    assert caught.value.status == 503 and caught.value.retryable is True
    assert dify_server.count(TEXT_EMBEDDING) == 3


def test_a_4xx_is_rejected_and_not_retried(dify_server, dify_transport):
    dify_server.fail_next(3, status=400, route=TEXT_EMBEDDING)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_REQUEST_REJECTED"
    assert caught.value.retryable is False
    assert dify_server.count(TEXT_EMBEDDING) == 1


def test_a_connection_dropped_mid_body_is_retried_for_embeddings(dify_server, dify_transport):
    dify_server.add_fault("drop", TEXT_EMBEDDING, after_bytes=30)
    assert embed(runtime(dify_transport), ["hello"]).shape == (1, 64)
    assert dify_server.count(TEXT_EMBEDDING) == 2

    dify_server.reset_observations()
    dify_server.add_fault("drop", TEXT_EMBEDDING, after_bytes=30, times=None)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_UNAVAILABLE" and caught.value.retryable is True
    assert caught.value.bytes_read == 30
    assert dify_server.count(TEXT_EMBEDDING) == 3


def test_input_is_checked_before_anything_is_sent(dify_server, dify_transport):
    client = runtime(dify_transport)
    for options in (
        {"texts": []},
        {"texts": ["x"], "input_type": "passage"},
        {"texts": ["x"], "provider": "openai"},
        {"texts": ["x"], "provider": "Langgenius/OpenAI/openai"},
        {"texts": ["x"], "tenant_id": " "},
    ):
        arguments = {"tenant_id": "t", "provider": OPENAI, "model": "m", **options}
        with pytest.raises(ModelRuntimeError) as caught:
            client.embed_texts(**arguments)
        assert caught.value.code == "MODEL_RUNTIME_INPUT_INVALID"
    assert dify_server.count(TEXT_EMBEDDING) == 0


# --- DifyEmbeddingModel ---------------------------------------------------------------------


def test_the_embedding_model_learns_its_dimension_from_the_first_answer(
    dify_server, dify_transport
):
    model = DifyEmbeddingModel(
        tenant_id="tenant-a", provider=OPENAI, model="text-embedding-3-small",
        runtime=runtime(dify_transport),
    )  # fmt: skip
    assert model.model_id == "dify/langgenius/openai/openai/text-embedding-3-small"
    documents = model.embed_documents(["annual leave policy", "expense reports"])
    assert documents.shape == (2, 64) and model.dimension == 64
    assert dify_server.count(TEXT_EMBEDDING) == 1  # no probe: the answer told the dimension
    query = model.embed_query("how many days of leave")
    assert query.shape == (64,) and query.dtype == np.float32
    assert float(documents[0] @ query) > float(documents[1] @ query)
    input_types = [c.body["input_type"] for c in dify_server.calls(TEXT_EMBEDDING)]
    assert input_types == ["document", "query"]
    assert model.embed_documents([]).shape == (0, 64)

    dify_server.dimension = 32  # the provider changed the model behind the same name
    with pytest.raises(EmbeddingDimensionMismatch):
        model.embed_documents(["anything"])


def test_reading_the_dimension_first_probes_once(dify_server, dify_transport):
    model = DifyEmbeddingModel(
        tenant_id="tenant-a", provider=OPENAI, model="m", runtime=runtime(dify_transport)
    )
    assert model.dimension == 64 and model.dimension == 64
    calls = dify_server.calls(TEXT_EMBEDDING)
    assert len(calls) == 1 and calls[0].body["input_type"] == "query"


def test_a_given_dimension_is_enforced_from_the_start(dify_server, dify_transport):
    model = DifyEmbeddingModel(
        tenant_id="t", provider=OPENAI, model="m", dimension=128, runtime=runtime(dify_transport)
    )
    assert model.dimension == 128 and dify_server.count(TEXT_EMBEDDING) == 0
    with pytest.raises(EmbeddingDimensionMismatch):
        model.embed_query("hello")


def test_the_existing_compile_and_query_path_runs_on_the_dify_model(
    space, settings, dify_server, dify_transport
):
    from ingestion.documents import admit_document
    from knowledgefs.testing.fixtures import compile_all
    from retrieval import index_versions
    from retrieval.modes import retrieve

    model_id = "dify/langgenius/openai/openai/text-embedding-3-small"
    client = runtime(dify_transport)

    def factory() -> DifyEmbeddingModel:
        return DifyEmbeddingModel(
            tenant_id=space.tenant_id, provider=OPENAI, model="text-embedding-3-small",
            model_id=model_id, runtime=client,
        )  # fmt: skip

    settings.KNOWLEDGE_EMBEDDING_MODELS = {model_id: factory}
    version = index_versions.change_embedding_model(space, model_id)
    assert (version.model_id, version.dimension, version.state) == (model_id, 64, "active")
    admit_document(
        space,
        filename="leave.md",
        data=b"# Leave\n\nEvery employee gets 25 days of annual leave per year.",
        enqueue=False,
    )
    admit_document(
        space,
        filename="expenses.md",
        data=b"# Expenses\n\nSubmit travel receipts within thirty days.",
        enqueue=False,
    )
    assert compile_all() == 2
    result = retrieve(space, "annual leave days per employee", top_k=2, legs=("dense",))
    assert result.items[0].citation["filename"] == "leave.md"
    calls = dify_server.calls(TEXT_EMBEDDING)
    assert {c.body["tenant_id"] for c in calls} == {space.tenant_id}
    assert {c.body["input_type"] for c in calls} == {"document", "query"}
    assert all(len(c.body["texts"]) <= 16 for c in calls)


# --- multimodal embedding, rerank, catalog --------------------------------------------------


def test_multimodal_documents_go_base64_eight_per_request(dify_server, dify_transport):
    documents = [
        MultimodalDocument(f"image {i} of a cat".encode(), file_id=f"img-{i}.png") for i in range(9)
    ]
    vectors = runtime(dify_transport).embed_multimodal(
        tenant_id="t", provider=COHERE, model="embed-v4.0", documents=documents
    )
    assert vectors.shape == (9, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    calls = dify_server.calls(MULTIMODAL_EMBEDDING)
    assert sorted(len(c.body["documents"]) for c in calls) == [1, 8]
    first = next(c for c in calls if len(c.body["documents"]) == 8).body["documents"][0]
    assert base64.b64decode(first["content"]) == b"image 0 of a cat"
    assert first["content_type"] == "image" and first["file_id"] == "img-0.png"


def test_rerank_returns_sorted_validated_hits(dify_server, dify_transport):
    client = runtime(dify_transport)
    docs = ["leave days per year", "travel receipts", "annual leave"]
    hits = client.rerank(
        tenant_id="t", provider=COHERE, model="rerank-v3.5", query="annual leave days", docs=docs
    )
    assert [h.index for h in hits] == [0, 2, 1]
    assert hits[0].score >= hits[1].score >= hits[2].score
    top = client.rerank(
        tenant_id="t", provider=COHERE, model="rerank-v3.5", query="annual leave days",
        docs=docs, top_n=1, score_threshold=0.5,
    )  # fmt: skip
    assert [h.index for h in top] == [0]
    body = dify_server.calls(RERANK)[-1].body
    assert (body["top_n"], body["score_threshold"], body["model_type"]) == (1, 0.5, "rerank")
    assert "top_n" not in dify_server.calls(RERANK)[0].body


@pytest.mark.parametrize(
    "docs",
    [
        [{"index": 5, "score": 0.3}],
        [{"index": -1, "score": 0.3}],
        [{"index": 0, "score": 0.3}, {"index": 0, "score": 0.2}],
        [{"index": 0, "score": float("nan")}],
        [{"index": 0, "score": float("inf")}],
        [{"index": 0, "score": "high"}],
        [{"index": True, "score": 0.3}],
    ],
)
def test_rerank_answers_out_of_range_or_not_finite_are_invalid(dify_server, dify_transport, docs):
    dify_server.add_fault("json", RERANK, status=200, body={"data": {"docs": docs}, "error": ""})
    with pytest.raises(ModelRuntimeError) as caught:
        runtime(dify_transport).rerank(
            tenant_id="t", provider=COHERE, model="r", query="q", docs=["a", "b"]
        )
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


def test_the_catalog_pages_and_filters(dify_server, dify_transport):
    client = runtime(dify_transport)
    first = client.list_models(tenant_id="t", model_type="llm", limit=2)
    assert [i.model for i in first.items] == ["gpt-4.1", "gpt-4.1-mini"]
    assert first.next_offset == 2
    rest = client.list_models(tenant_id="t", model_type="llm", limit=2, offset=first.next_offset)
    assert [i.model for i in rest.items] == ["o4-mini"] and rest.next_offset is None
    cohere = client.list_models(tenant_id="t", model_type="text-embedding", provider=COHERE)
    assert [(i.canonical_provider, i.model) for i in cohere.items] == [(COHERE, "embed-v4.0")]
    body = dify_server.calls(MODEL_CATALOG)[-1].body
    assert body == {
        "tenant_id": "t",
        "user_id": "knowledge-fs",
        "model_type": "text-embedding",
        "limit": 100,
        "offset": 0,
        "provider": COHERE,
    }
    for options in ({"limit": 101}, {"limit": 0}, {"offset": -1}, {"model_type": "tts"}):
        with pytest.raises(ModelRuntimeError, match="MODEL_RUNTIME_INPUT_INVALID"):
            client.list_models(tenant_id="t", **{"model_type": "llm", **options})
    assert dify_server.count(MODEL_CATALOG) == 3


def test_malformed_catalog_items_are_invalid(dify_server, dify_transport):
    dify_server.add_fault(
        "json", MODEL_CATALOG, status=200, body={"data": {"items": [{"model": "x"}]}, "error": ""}
    )
    with pytest.raises(ModelRuntimeError) as caught:
        runtime(dify_transport).list_models(tenant_id="t", model_type="llm")
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


# --- LLM frames -----------------------------------------------------------------------------


def test_llm_frames_are_parsed_as_they_arrive(dify_server, dify_transport):
    chunks = list(llm(runtime(dify_transport)))
    assert "".join(c["delta"]["message"]["content"] for c in chunks) == "".join(LLM_ANSWER)
    assert chunks[-1]["delta"]["finish_reason"] == "stop"
    body = dify_server.calls(LLM)[0].body
    assert body["stream"] is True and body["mode"] == "chat" and body["model_type"] == "llm"
    assert body["prompt_messages"] == [{"role": "user", "content": "How many days of leave?"}]
    assert body["completion_params"] == {"temperature": 0} and body["stop"] == []


def test_the_frame_decoder_handles_any_split():
    payloads = [json.dumps({"data": {"n": i}, "error": ""}).encode() for i in range(3)]
    stream = b"".join(encode_frame(p) for p in payloads)
    for size in (1, 3, 13, 14, len(stream)):
        decoder = FrameDecoder(errors=ModelRuntimeError, route=LLM, max_frame_bytes=1000)
        out = []
        for start in range(0, len(stream), size):
            out += decoder.feed(stream[start : start + size])
        decoder.finish()
        assert out == payloads
    # Layout: magic, reserved, header length 10 (LE), data length (LE), six reserved bytes.
    assert encode_frame(b"{}")[:14] == bytes([0x0F, 0, 10, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0])


def test_a_stream_cut_inside_a_frame_is_invalid(dify_server, dify_transport):
    dify_server.add_fault("truncate", LLM)
    received = []
    with pytest.raises(ModelRuntimeError) as caught:
        for chunk in llm(runtime(dify_transport)):
            received.append(chunk)
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"
    assert "ended inside frame 1" in caught.value.message
    assert len(received) == 1  # the complete first frame was delivered as it arrived


@pytest.mark.parametrize(
    "stream",
    [
        b'{"data": {}}',  # not framed at all
        bytes([0x0F, 0, 9, 0, 2, 0, 0, 0]) + bytes(5) + b"{}",  # header shorter than 10
        encode_frame(b"{not json"),
    ],
)
def test_malformed_frames_are_invalid(stream):
    decoder = FrameDecoder(errors=ModelRuntimeError, route=LLM, max_frame_bytes=1000)
    with pytest.raises(ModelRuntimeError) as caught:
        for payload in decoder.feed(stream):
            parse_json(payload, errors=ModelRuntimeError, route=LLM)
        decoder.finish()
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


def test_an_unframed_llm_answer_is_invalid(dify_server, dify_transport):
    dify_server.add_fault("json", LLM, status=200, body={"data": {"delta": {}}, "error": ""})
    with pytest.raises(ModelRuntimeError) as caught:
        list(llm(runtime(dify_transport)))
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


def test_frame_and_stream_caps(dify_server, dify_transport):
    assert len(list(llm(runtime(dify_transport, max_response_bytes=1024)))) == 3
    with pytest.raises(ModelRuntimeError) as caught:
        list(llm(runtime(dify_transport, max_response_bytes=60)))  # each frame is ~100 bytes
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_TOO_LARGE"
    assert caught.value.retryable is False
    decoder = FrameDecoder(errors=ModelRuntimeError, route=LLM, max_frame_bytes=64)
    with pytest.raises(ModelRuntimeError, match="declares 114 bytes"):
        decoder.feed(encode_frame(b"x" * 100)[:8])  # refused from its header alone


def test_an_error_frame_is_a_model_error(dify_server, dify_transport):
    dify_server.add_fault("frame_error", LLM, message="model overloaded, token=abc123secret")
    received = []
    with pytest.raises(ModelRuntimeError) as caught:
        for chunk in llm(runtime(dify_transport)):
            received.append(chunk)
    assert caught.value.code == "MODEL_RUNTIME_ERROR" and caught.value.retryable is False
    assert "model overloaded" in caught.value.message
    assert "abc123secret" not in caught.value.message
    assert len(received) == 1


def test_an_llm_stream_is_retried_before_its_first_byte(dify_server, dify_transport):
    dify_server.fail_next(1, status=503, route=LLM)
    assert len(list(llm(runtime(dify_transport)))) == 3
    assert dify_server.count(LLM) == 2


def test_an_llm_stream_is_never_retried_once_bytes_arrived(dify_server, dify_transport):
    dify_server.add_fault("drop", LLM, after_bytes=150)
    received = []
    with pytest.raises(ModelRuntimeError) as caught:
        for chunk in llm(runtime(dify_transport)):
            received.append(chunk)
    assert caught.value.code == "MODEL_RUNTIME_UNAVAILABLE" and caught.value.retryable is True
    assert received  # bytes had arrived
    assert dify_server.count(LLM) == 1


@pytest.mark.timeout(15)
def test_a_stalled_llm_stream_times_out_within_the_timeout(dify_server, dify_transport):
    dify_server.add_fault("stall", LLM, after_bytes=150, seconds=10)
    received = []

    def consume():
        for chunk in llm(runtime(dify_transport, timeout_ms=800)):
            received.append(chunk)

    took, error = elapsed(consume)
    assert isinstance(error, ModelRuntimeError) and error.code == "MODEL_RUNTIME_TIMEOUT"
    assert received and took < 0.8 + MARGIN


def test_closing_an_llm_stream_early_frees_the_connection(dify_server, dify_transport):
    stream = llm(runtime(dify_transport))
    assert next(stream)["delta"]["index"] == 0
    stream.close()
    assert len(list(llm(runtime(dify_transport)))) == 3  # the pool still works


# --- object storage -------------------------------------------------------------------------


def test_a_round_trip_keeps_the_key_and_sends_checksum_metadata_and_type(
    dify_server, dify_transport
):
    store = storage(dify_transport)
    data = b"Leave policy: 25 days.\n" * 100
    key = "spaces/s1/documents/d1/source.txt"
    info = store.save_object(
        key, ContentFile(data), metadata={"documentId": "d1"}, content_type="text/plain"
    )
    assert (info.key, info.size_bytes, info.checksum_sha256_base64) == (
        key,
        len(data),
        checksum(data),
    )
    put = dify_server.calls(OBJECT)[0]
    assert put.method == "PUT" and put.query == {"key": key}
    assert put.headers["X-Knowledge-FS-Checksum-Sha256"] == checksum(data)
    assert put.headers["X-Knowledge-FS-Content-Type"] == "text/plain"
    encoded = put.headers["X-Knowledge-FS-Metadata"]
    assert "=" not in encoded.rstrip("=") and "+" not in encoded and "/" not in encoded
    assert json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))) == {
        "documentId": "d1"
    }
    stored = dify_server.objects[key]
    assert stored.data == data and stored.metadata == {"documentId": "d1"}

    with store.open(key) as handle:
        assert handle.size == len(data)
        assert handle.read() == data
    assert store.exists(key) and store.size(key) == len(data)
    assert store.metadata(key).content_type == "text/plain"

    # Saving again under the same key replaces: never renamed.
    assert store.get_available_name(key) == key
    assert store.save(key, ContentFile(b"v2")) == key
    assert dify_server.objects[key].data == b"v2"

    store.delete(key)
    store.delete(key)  # a missing object is not an error
    assert not store.exists(key)


def test_put_and_read_object_work_through_the_storage_api(settings, dify_server):
    from knowledgefs import storage as boundary

    settings.STORAGES = {
        **settings.STORAGES,
        "objects": {
            "BACKEND": "knowledgefs.dify.object_storage.DifyObjectStorage",
            "OPTIONS": {"base_url": dify_server.url, "api_key": TEST_INNER_KEY},
        },
    }
    assert isinstance(boundary.object_storage(), DifyObjectStorage)
    boundary.put_object("a/b.txt", b"hello")
    assert boundary.read_object("a/b.txt", max_bytes=5) == b"hello"
    with pytest.raises(ValueError, match="larger than 4 bytes"):
        boundary.read_object("a/b.txt", max_bytes=4)
    assert boundary.storage_writable()
    boundary.delete_object("a/b.txt")
    assert "a/b.txt" not in dify_server.objects


@pytest.mark.timeout(30)
def test_a_streamed_read_stops_at_the_limit_without_the_whole_object(
    settings, dify_server, dify_transport
):
    from knowledgefs import storage as boundary

    big = bytes(range(256)) * (96 * 1024)  # 24 MiB
    dify_server.objects["big.bin"] = StoredObject(big, checksum(big), None, {})
    limit = MiB
    with storage(dify_transport).open("big.bin") as handle:
        assert handle.size == len(big)
        assert handle.read(limit + 1) == big[: limit + 1]
        assert handle.bytes_received <= limit + 1 + 64 * 1024
    assert wait_until(lambda: dify_server.in_flight(OBJECT) == 0, timeout=10)
    assert dify_server.calls(OBJECT)[0].bytes_sent < 16 * MiB

    # knowledgefs.storage.read_object reads max_bytes + 1 through the Storage API.
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": {
            "BACKEND": "knowledgefs.dify.object_storage.DifyObjectStorage",
            "OPTIONS": {"base_url": dify_server.url, "api_key": TEST_INNER_KEY},
        },
    }
    dify_server.reset_observations()
    with pytest.raises(ValueError, match=f"larger than {limit} bytes"):
        boundary.read_object("big.bin", max_bytes=limit)
    assert wait_until(lambda: dify_server.in_flight(OBJECT) == 0, timeout=10)
    assert dify_server.calls(OBJECT)[0].bytes_sent < 16 * MiB

    # A declared size over an explicit limit is refused before reading.
    with pytest.raises(ObjectStorageError) as caught:
        storage(dify_transport).open_object("big.bin", max_bytes=limit)
    assert caught.value.code == "STORAGE_OBJECT_TOO_LARGE" and caught.value.bytes_read == 0


def test_reading_an_object_verifies_its_checksum(dify_server, dify_transport):
    store = storage(dify_transport)
    store.save("c.txt", ContentFile(b"trusted bytes"))
    dify_server.add_fault("bad_checksum", OBJECT)
    with store.open("c.txt") as handle, pytest.raises(ObjectStorageError) as caught:
        handle.read()
    assert caught.value.code == "STORAGE_CHECKSUM_MISMATCH" and caught.value.retryable is False
    with store.open("c.txt") as handle:
        assert handle.read() == b"trusted bytes"


def test_an_upload_that_does_not_match_its_checksum_is_refused(dify_server, dify_transport):
    dify_server.add_fault("corrupt_upload", OBJECT)
    with pytest.raises(ObjectStorageError) as caught:
        storage(dify_transport).save("d.txt", ContentFile(b"some bytes"))
    assert caught.value.code == "STORAGE_CHECKSUM_MISMATCH" and caught.value.status == 422
    assert caught.value.retryable is False
    assert dify_server.count(OBJECT) == 1 and "d.txt" not in dify_server.objects


def test_objects_over_the_size_limit(dify_server, dify_transport):
    dify_server.max_object_bytes = 1024
    with pytest.raises(ObjectStorageError) as caught:
        storage(dify_transport).save("big.bin", ContentFile(b"x" * 2048))
    assert caught.value.code == "STORAGE_OBJECT_TOO_LARGE" and caught.value.status == 413
    assert dify_server.count(OBJECT) == 1

    dify_server.reset_observations()
    with pytest.raises(ObjectStorageError) as caught:
        storage(dify_transport, max_object_bytes=1000).save("big.bin", ContentFile(b"x" * 2048))
    assert caught.value.code == "STORAGE_OBJECT_TOO_LARGE"
    assert dify_server.count(OBJECT) == 0  # refused before sending


def test_a_missing_object(dify_server, dify_transport):
    store = storage(dify_transport)
    with pytest.raises(StorageNotFound) as caught:
        store.open("nothing/here.txt")
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.code == "STORAGE_NOT_FOUND" and caught.value.retryable is False
    with pytest.raises(FileNotFoundError):
        store.size("nothing/here.txt")
    assert not store.exists("nothing/here.txt")
    assert store.metadata("nothing/here.txt") is None
    store.delete("nothing/here.txt")


def test_listing_pages_with_a_cursor(dify_server, dify_transport):
    for i in range(250):
        data = f"object {i}".encode()
        dify_server.objects[f"docs/{i:04d}.txt"] = StoredObject(data, checksum(data), None, {})
    for key in ("docs/sub/x.txt", "docs/sub/y.txt", "other/z.txt"):
        dify_server.objects[key] = StoredObject(b"z", checksum(b"z"), None, {})
    store = storage(dify_transport)
    page = store.list_objects("docs/", limit=100)
    assert len(page.objects) == 100 and page.next_cursor == "docs/0099.txt"
    keys = [o.key for o in store.iter_objects("docs/")]
    assert keys == sorted(k for k in dify_server.objects if k.startswith("docs/"))
    assert len(keys) == 252
    cursors = [c.query.get("cursor") for c in dify_server.calls(OBJECTS)[1:]]
    assert cursors == [None, "docs/0099.txt", "docs/0199.txt"]
    directories, files = store.listdir("docs")
    assert directories == ["sub"] and len(files) == 250 and files[0] == "0000.txt"
    assert store.listdir("") == (["docs", "other"], [])
    with pytest.raises(ObjectStorageError, match="STORAGE_INPUT_INVALID"):
        store.list_objects("docs/", limit=101)


def test_idempotent_storage_calls_are_retried(dify_server, dify_transport):
    store = storage(dify_transport)
    dify_server.fail_next(1, status=503, route=OBJECT)
    store.save("r.txt", ContentFile(b"retried put"))
    assert [c.status for c in dify_server.calls(OBJECT)] == [503, 200]
    assert dify_server.objects["r.txt"].data == b"retried put"

    dify_server.reset_observations()
    dify_server.fail_next(2, status=502, route=OBJECT)
    with store.open("r.txt") as handle:
        assert handle.read() == b"retried put"
    assert [c.status for c in dify_server.calls(OBJECT)] == [502, 502, 200]

    dify_server.reset_observations()
    dify_server.fail_next(1, status=429, route=OBJECT)
    store.delete("r.txt")
    assert [c.status for c in dify_server.calls(OBJECT)] == [429, 204]


@pytest.mark.timeout(15)
def test_a_stalled_object_read_times_out_within_the_timeout(dify_server, dify_transport):
    store = storage(dify_transport, timeout_ms=600)
    data = b"y" * 200_000
    dify_server.objects["slow.bin"] = StoredObject(data, checksum(data), None, {})
    dify_server.add_fault("stall", OBJECT, after_bytes=1000, seconds=10)

    def read():
        with store.open("slow.bin") as handle:
            handle.read()

    took, error = elapsed(read)
    assert isinstance(error, ObjectStorageError) and error.code == "STORAGE_TIMEOUT"
    assert error.retryable is True and took < 0.6 + MARGIN


def test_health(dify_server, dify_transport):
    store = storage(dify_transport)
    assert store.health() and store.health().detail == "dify"
    dify_server.storage_healthy = False
    health = store.health()
    assert not health and "STORAGE_UNAVAILABLE" in health.detail
    offline = storage(DifyTransport("http://127.0.0.1:9", TEST_INNER_KEY))
    assert not offline.health(timeout_ms=2000)
    dify_server.storage_healthy = True
    dify_server.delay(10, route="/inner/api/knowledge-fs/storage/health")
    took, _ = elapsed(lambda: store.health(timeout_ms=300))
    assert took < 0.3 + MARGIN


def test_keys_dify_would_refuse_never_leave_the_process(dify_server, dify_transport):
    store = storage(dify_transport)
    for key in ("../x", "/abs", "a//b", "a/./b", " a", "a\\b", "a\x00b", "x" * 1025):
        with pytest.raises(SuspiciousFileOperation):
            store.save(key, ContentFile(b"x"))
        with pytest.raises(SuspiciousFileOperation):
            store.open_object(key)
    with pytest.raises(ValueError, match="read-only"):
        store.open("a.txt", "wb")
    assert dify_server.requests == []


# --- datasources ----------------------------------------------------------------------------


def datasources(transport) -> DifyDatasources:
    return DifyDatasources(transport=transport)


def test_credentials_are_validated_by_credential_id(dify_server, dify_transport):
    client = datasources(dify_transport)
    common = {"tenant_id": "t", "provider": DRIVE, "datasource": "google_drive"}
    assert client.validate_credentials("cred-drive-ok", datasource_type="online_drive", **common)
    assert not client.validate_credentials("cred-expired", datasource_type="online_drive", **common)
    body = dify_server.calls(DATASOURCE)[0].body
    assert body == {
        "tenant_id": "t",
        "user_id": "knowledge-fs",
        "provider": DRIVE,
        "datasource": "google_drive",
        "datasource_type": "online_drive",
        "operation": "validate_credentials",
        "credential_id": "cred-drive-ok",
    }
    with pytest.raises(DatasourceError) as caught:
        client.validate_credentials("cred-unknown", datasource_type="online_drive", **common)
    assert caught.value.code == "DATASOURCE_ERROR" and caught.value.retryable is False


def test_no_raw_credential_can_be_passed():
    for method in (DifyDatasources.validate_credentials, DifyDatasources.browse):
        parameters = inspect.signature(method).parameters
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        assert [n for n in parameters if "credential" in n] == ["credential_id"]
    client = DifyDatasources(transport=DifyTransport("http://127.0.0.1:9", TEST_INNER_KEY))
    with pytest.raises(TypeError):
        client.validate_credentials(  # type: ignore[call-arg]
            "cred-drive-ok",
            tenant_id="t",
            provider=DRIVE,
            datasource="google_drive",
            datasource_type="online_drive",
            credentials={"access_token": "ya29.secret"},
        )
    for parameters in ({"access_token": "ya29.secret"}, {"auth": {"client_secret": "s"}}):
        with pytest.raises(DatasourceError, match="DATASOURCE_INPUT_INVALID"):
            client.browse(
                "cred-notion-ok",
                tenant_id="t",
                provider=NOTION,
                datasource="notion",
                datasource_type="online_document",
                datasource_parameters=parameters,
            )
    with pytest.raises(DatasourceError, match="DATASOURCE_INPUT_INVALID"):
        client.validate_credentials(
            "sk-not an id", tenant_id="t", provider=DRIVE, datasource="d",
            datasource_type="online_drive",
        )  # fmt: skip


def test_browsing_a_drive_pages_with_next_page_parameters(dify_server, dify_transport):
    client = datasources(dify_transport)
    options = {
        "tenant_id": "t",
        "provider": DRIVE,
        "datasource": "google_drive",
        "datasource_type": "online_drive",
        "prefix": "report-",
        "max_keys": 10,
    }
    names, parameters, pages = [], None, 0
    while True:
        frames = client.browse("cred-drive-ok", next_page_parameters=parameters, **options)
        result = frames[0]["result"][0]
        names += [f["name"] for f in result["files"]]
        pages += 1
        if not result["is_truncated"]:
            break
        parameters = result["next_page_parameters"]
    assert pages == 3 and len(names) == 25 and names[0] == "report-000.pdf"
    request = dify_server.calls(DATASOURCE)[1].body["request"]
    assert request == {"prefix": "report-", "max_keys": 10, "next_page_parameters": {"offset": 10}}
    for max_keys in (0, 1001):
        with pytest.raises(DatasourceError, match="DATASOURCE_INPUT_INVALID"):
            client.browse("cred-drive-ok", **{**options, "max_keys": max_keys})


def test_online_document_pages(dify_server, dify_transport):
    frames = datasources(dify_transport).browse(
        "cred-notion-ok", tenant_id="t", provider=NOTION, datasource="notion",
        datasource_type="online_document", datasource_parameters={"workspace": "ws-1"},
    )  # fmt: skip
    workspace = frames[0]["result"][0]
    assert [p["page_id"] for p in workspace["pages"]] == ["page-0", "page-1", "page-2"]
    body = dify_server.calls(DATASOURCE)[0].body
    assert body["operation"] == "get_online_document_pages"
    assert body["datasource_parameters"] == {"workspace": "ws-1"}


def test_datasource_calls_are_never_retried_inline(dify_server, dify_transport):
    dify_server.fail_next(1, status=503, route=DATASOURCE)
    with pytest.raises(DatasourceError) as caught:
        datasources(dify_transport).validate_credentials(
            "cred-drive-ok", tenant_id="t", provider=DRIVE, datasource="d",
            datasource_type="online_drive",
        )  # fmt: skip
    assert caught.value.code == "DATASOURCE_UNAVAILABLE" and caught.value.retryable is True
    assert dify_server.count(DATASOURCE) == 1


def test_an_oversized_datasource_answer(dify_server, dify_transport):
    client = DifyDatasources(transport=dify_transport, max_response_bytes=100)
    with pytest.raises(DatasourceError) as caught:
        client.browse(
            "cred-drive-ok", tenant_id="t", provider=DRIVE, datasource="d",
            datasource_type="online_drive", max_keys=25,
        )  # fmt: skip
    assert caught.value.code == "DATASOURCE_RESPONSE_TOO_LARGE"


# --- messages and logs ----------------------------------------------------------------------


def test_sanitize_message():
    text = sanitize_message(
        "Bearer abc.def.ghi failed; password: hunter2; key sk-proj-abcdefghijkl; "
        "https://user:pw@host/x; " + "Z" * 40 + "\nnext line",
        secrets=["inner-secret-1234"],
        inputs=["a long document sentence that leaked"],
    )
    for secret in ("abc.def.ghi", "hunter2", "sk-proj-abcdefghijkl", "user:pw", "Z" * 40, "\n"):
        assert secret not in text
    long = sanitize_message("word " * 300)
    assert long.endswith("…") and len(long) == 240
    assert sanitize_message("leaked a long document sentence that leaked", inputs=[
        "a long document sentence that leaked"]) == "leaked [input]"  # fmt: skip


def test_no_key_text_prompt_or_answer_reaches_any_log_record(caplog, dify_server, dify_transport):
    for name in ("", "knowledgefs", "knowledgefs.dify", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)
    document = "Confidential merger memo: Orion acquires Vega for 3 billion"
    prompt = "Summarize the confidential Orion memo for the board"
    client = runtime(dify_transport)

    dify_server.fail_next(1, status=503, route=TEXT_EMBEDDING)  # a retry is logged too
    embed(client, [document, "second confidential paragraph about Vega"])
    answer = "".join(c["delta"]["message"]["content"] for c in llm(client, prompt))
    dify_server.add_fault("envelope", TEXT_EMBEDDING, message=f"bad input {document}")
    with pytest.raises(ModelRuntimeError):
        embed(client, [document])
    store = storage(dify_transport)
    store.save("memo.txt", ContentFile(document.encode()))
    with store.open("memo.txt") as handle:
        assert handle.read() == document.encode()

    records = caplog.records
    assert any(r.name == "knowledgefs.dify" and TEXT_EMBEDDING in r.getMessage() for r in records)
    assert any("retry" in r.getMessage() for r in records)
    forbidden = [TEST_INNER_KEY, document, "Orion", "Vega", prompt, answer, LLM_ANSWER[1].strip()]
    for record in records:
        text = record.getMessage() + " " + (record.exc_text or "") + " " + repr(record.__dict__)
        for secret in forbidden:
            assert secret not in text, (record.name, secret)


def test_the_checksum_helper_matches_hashlib():
    data = b"abc"
    assert checksum(data) == base64.b64encode(hashlib.sha256(data).digest()).decode()


# --- the deadline covers the whole call (raw-socket adversaries) -----------------------------


class RawServer:
    """A one-purpose TCP server on 127.0.0.1: ``handler(conn)`` runs in a thread per connection."""

    def __init__(self, handler, *, rcvbuf: int | None = None) -> None:
        import socket
        import threading

        self._handler = handler
        self._sock = socket.socket()
        if rcvbuf:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.stopped = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:  # noqa: ANN001
        try:
            self._handler(conn, self.stopped)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.stopped.set()
        self._sock.close()


def _read_head(conn) -> bytes:  # noqa: ANN001
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.timeout(30)
def test_the_deadline_holds_against_trickled_response_headers():
    def trickle(conn, stopped) -> None:  # noqa: ANN001
        _read_head(conn)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n":
            if stopped.wait(0.4):
                return
            conn.sendall(bytes([byte]))

    server = RawServer(trickle)
    try:
        transport = DifyTransport(server.url, TEST_INNER_KEY, backoff_base=0.01)
        client = runtime(transport, timeout_ms=2000)
        took, error = elapsed(
            lambda: client.list_models(tenant_id="tenant-a", model_type="text-embedding")
        )
    finally:
        server.stop()
    assert isinstance(error, ModelRuntimeError), error
    assert error.code == "MODEL_RUNTIME_TIMEOUT" and error.retryable is True
    assert took < 2.0 + MARGIN


@pytest.mark.timeout(60)
def test_the_deadline_holds_against_a_server_that_reads_an_upload_slowly():
    def slow_reader(conn, stopped) -> None:  # noqa: ANN001
        conn.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
        while not stopped.wait(0.25):
            if not conn.recv(64 * 1024):
                return

    server = RawServer(slow_reader, rcvbuf=4096)
    try:
        transport = DifyTransport(server.url, TEST_INNER_KEY, backoff_base=0.01)
        store = storage(transport, timeout_ms=3000)
        data = b"x" * (8 * MiB)
        took, error = elapsed(lambda: store.save("slow/upload.bin", ContentFile(data)))
    finally:
        server.stop()
    assert isinstance(error, ObjectStorageError), error
    assert error.code == "STORAGE_TIMEOUT" and error.retryable is True
    assert took < 3.0 + MARGIN


@pytest.mark.timeout(30)
def test_the_deadline_holds_while_connecting_and_a_shut_connection_is_never_reused(
    dify_server, dify_transport
):
    # A call whose deadline shut its socket mid-body leaves no broken connection in the pool:
    # the calls after it succeed on the same transport, and keep-alive still reuses connections.
    client = runtime(dify_transport)
    embed(client, ["warm the pool"])
    dify_server.add_fault("stall", TEXT_EMBEDDING, after_bytes=20, seconds=5)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport, timeout_ms=500), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_TIMEOUT"
    for _ in range(5):
        assert embed(client, ["hello"]).shape == (1, 64)


@pytest.mark.timeout(30)
def test_keep_alive_reuses_one_connection_for_sequential_calls():
    served = []

    def keep_alive(conn, stopped) -> None:  # noqa: ANN001
        body = json.dumps({"data": {"items": [], "next_offset": None}, "error": ""}).encode()
        while not stopped.is_set():
            head = _read_head(conn)
            if not head:
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            rest = head.split(b"\r\n\r\n", 1)[1]
            while len(rest) < length:
                rest += conn.recv(length - len(rest))
            served.append(1)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )

    server = RawServer(keep_alive)
    try:
        transport = DifyTransport(server.url, TEST_INNER_KEY)
        client = runtime(transport, timeout_ms=2000)
        for _ in range(4):
            page = client.list_models(tenant_id="tenant-a", model_type="text-embedding")
            assert page.items == []
        # The last alarm of each call was cancelled when its connection went back to the pool:
        # waiting past the deadlines breaks nothing.
        time.sleep(2.2)
        assert client.list_models(tenant_id="tenant-a", model_type="llm").items == []
    finally:
        server.stop()
    assert len(served) == 5 and server.connections == 1


# --- envelopes, messages, configuration, vectors, bounded reads -------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"error": None, "message": "Not Found"},
        {"data": None, "error": None},
        {"message": "Not Found"},
    ],
)
def test_an_answer_that_is_not_an_envelope_is_invalid_not_a_model_error(
    dify_server, dify_transport, body
):
    dify_server.add_fault("json", MODEL_CATALOG, status=200, body=body)
    with pytest.raises(ModelRuntimeError) as caught:
        runtime(dify_transport).list_models(tenant_id="tenant-a", model_type="llm")
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"
    assert caught.value.retryable is False


def test_a_quoted_middle_part_of_an_input_never_reaches_the_error(dify_server, dify_transport):
    text = (
        "Board minutes, confidential. The Pelican acquisition closes on 3 March for "
        "412 million; the staff are told on 1 April. End of minutes."
    )
    middle = "Pelican acquisition closes on 3 March"
    dify_server.add_fault(
        "envelope", TEXT_EMBEDDING, message=f"Content policy violation near '{middle}' (code 42)"
    )
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["short one", text])
    message = str(caught.value)
    assert "Pelican" not in message and "412 million" not in message
    assert "Content policy violation near '[input]' (code 42)" in message


def test_sanitize_message_redacts_any_span_of_20_characters_found_in_an_input():
    inputs = ["x" * 5, "The quick brown fox jumps over the lazy dog near the river bank"]
    assert (
        sanitize_message("bad: «brown fox jumps over the lazy» ok", inputs=inputs)
        == "bad: «[input]» ok"
    )
    # 19 characters of an input are not an echo; unrelated text is kept.
    assert sanitize_message("fox jumps over the ", inputs=inputs) == "fox jumps over the"
    # Two separate echoes, and an echo at the very end of a long message.
    long = "a" * 3000 + " lazy dog near the river bank"
    assert "river" not in sanitize_message(long, inputs=inputs)
    text = sanitize_message(
        "1: quick brown fox jumps, 2: the lazy dog near the river", inputs=inputs
    )
    assert text == "1:[input], 2:[input]"  # the spaces are part of the echoed spans


def test_an_inner_api_url_is_never_echoed_and_refuses_userinfo_query_and_fragment():
    for url in (
        "http://admin:hunter2@api:5001",
        "http://hunter2@api:5001",
        "http://@api:5001",
        "http://api:5001/?token=hunter2",
        "http://api:5001/#hunter2",
        "http://api:5001/?",
        "http://api:hunter2",
        "ftp://hunter2.example",
        "http://api:5001/hun\nter2",
        "http://api:5001/hunter2 x",
    ):
        with pytest.raises(DifyNotConfigured) as caught:
            DifyTransport(url, TEST_INNER_KEY)
        assert "hunter2" not in str(caught.value), url
        assert "DIFY_INNER_API_URL" in str(caught.value)
    result = _setup_django(DIFY_INNER_API_URL="http://u:hunter2@api:5001/?q=1#f")
    assert result.returncode != 0
    assert "DIFY_INNER_API_URL" in result.stderr and "hunter2" not in result.stderr
    result = _setup_django(DIFY_INNER_API_URL="http://api:5001/?q=hunter2")
    assert result.returncode != 0
    assert "query string or fragment" in result.stderr and "hunter2" not in result.stderr


@pytest.mark.parametrize(
    "key", ["0123456789abcdef\n", "0123456789\tabcdef", "0123456789abcdef\x7f"]
)
def test_an_inner_api_key_with_a_control_character_is_refused_at_start_up(key):
    result = _setup_django(DIFY_INNER_API_KEY=key)
    assert result.returncode != 0
    assert "DIFY_INNER_API_KEY must be at least 16 printable ASCII characters" in result.stderr
    assert _setup_django(DIFY_INNER_API_KEY="0123456789abcdef").returncode == 0


@pytest.mark.parametrize(
    "vector", [["0.5", "1e0", True], [0.5, True], [0.5, "1"], [0.5, None], [0.5, 10**400]]
)
def test_embedding_values_must_be_json_numbers(dify_server, dify_transport, vector):
    body = {"data": {"embeddings": [vector]}, "error": ""}
    dify_server.add_fault("json", TEXT_EMBEDDING, status=200, body=body)
    with pytest.raises(ModelRuntimeError) as caught:
        embed(runtime(dify_transport), ["hello"])
    assert caught.value.code == "MODEL_RUNTIME_RESPONSE_INVALID"


def test_read_object_refuses_a_declared_oversize_before_reading(settings, dify_server):
    from knowledgefs import storage as boundary

    settings.STORAGES = {
        **settings.STORAGES,
        "objects": {
            "BACKEND": "knowledgefs.dify.object_storage.DifyObjectStorage",
            "OPTIONS": {"base_url": dify_server.url, "api_key": TEST_INNER_KEY},
        },
    }
    big = b"y" * (2 * MiB)
    dify_server.objects["big.bin"] = StoredObject(big, checksum(big), None, {})
    with pytest.raises(ValueError, match="larger than 1000 bytes") as caught:
        boundary.read_object("big.bin", max_bytes=1000)
    cause = caught.value.__cause__
    assert isinstance(cause, ObjectStorageError)
    assert cause.code == "STORAGE_OBJECT_TOO_LARGE" and cause.bytes_read == 0
    assert boundary.read_object("big.bin", max_bytes=2 * MiB) == big
