"""The Dify vector and text bridge as the search backend (``KNOWLEDGE_SEARCH_BACKEND=dify``).

Real documents (pages of this repository's ``docs/``) are uploaded through the API, compiled by
the compiler (local ONNX embeddings) and queried through the API, with the index in the Dify
contract server's bridge (``knowledgefs/testing/dify_server.py``, :class:`BridgeStore`): the same
top results as the database backend, batches of at most 64 points (the server refuses more),
searches restricted to the ids SQL authorizes, deletes that leave nothing behind, and Dify's
failures answered with stable codes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from django.db import connection
from django.db.models import F

from ingestion.models import Document, KnowledgeNode
from knowledgefs import health
from knowledgefs.dify.errors import TextStoreError, VectorStoreError
from knowledgefs.dify.text_store import DifyTextStore, TextPoint, TextScope
from knowledgefs.dify.vector_store import DifyVectorStore, VectorPoint, VectorScope
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import TEST_INNER_KEY, TEXTS, VECTORS
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.backends import get_search_backend
from retrieval.backends.dify import DifyBridgeBackend, vector_space_id
from retrieval.models import DenseVector
from retrieval.modes import retrieve
from spaces.models import KnowledgeSpace

dify_server = dify_fixtures.dify_server
dify_transport = dify_fixtures.dify_transport

ROOT = Path(__file__).resolve().parents[2]
# Five pages of this project's documentation, frozen as they were when the agreement between
# the backends was measured (about 80 KB): more than 64 chunks, so the upserts need two batches.
# A copy, not docs/ itself, so that editing the docs cannot move the rankings compared here.
CORPUS = ROOT / "tests" / "fixtures" / "bridge-docs"
DOCS = ["dify-boundary.md", "operations.md", "security.md", "testing.md", "unstructured.md"]
QUERIES = [
    "which Dify errors are retryable",
    "rotating the capability token signing key",
    "how are tests run against PostgreSQL",
    "what does the local parser endpoint do with large files",
    "backups and restore of the database",
]
SPACES = "/v1/knowledge-spaces"


def _files() -> dict[str, bytes]:
    return {name: (CORPUS / name).read_bytes() for name in DOCS}


@pytest.fixture
def bridge(settings, dify_server):
    """``KNOWLEDGE_SEARCH_BACKEND=dify`` on the contract server (the model runtime stays
    local); yields the server."""
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_SEARCH_BACKEND = "dify"
    yield dify_server


def _space_with_documents(client, files: dict[str, bytes], name: str = "Docs") -> dict:
    space = client.post(SPACES, {"name": name}, format="json").json()
    for filename, data in files.items():
        answer = upload(client, KnowledgeSpace(id=space["id"]), filename, data)
        assert answer.status_code == 202, answer.content
    assert compile_all() == len(files)
    documents = Document.objects.filter(space_id=space["id"])
    assert {d.state for d in documents} == {"published"}, [
        (d.filename, d.error_code, d.error_message) for d in documents
    ]
    return space


def _ask(client, space_id: str, query: str, mode: str, top_k: int = 5) -> list[dict]:
    answer = client.post(
        f"{SPACES}/{space_id}/retrieval-tests",
        {"query": query, "top_k": top_k, "mode": mode},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["items"]


def _cited(items: list[dict]) -> list[tuple]:
    return [
        (i["citation"]["filename"], i["citation"]["start_offset"], i["citation"]["end_offset"])
        for i in items
    ]


def _dense_leg(space_id: str, query: str) -> list[tuple]:
    """The dense leg alone: ``[((filename, start), raw cosine)]``, best first."""
    result = retrieve(KnowledgeSpace.objects.get(id=space_id), query, top_k=10, legs=("dense",))
    return [
        ((i.citation["filename"], i.citation["start_offset"]), i.scores["dense_raw"])
        for i in result.items
    ]


def _published(space_id) -> set[str]:
    return {
        str(i)
        for i in KnowledgeNode.objects.filter(
            space_id=space_id, generation=F("document__active_generation")
        ).values_list("id", flat=True)
    }


# --- the whole path ---------------------------------------------------------------------------


def test_compiled_through_the_bridge_answers_like_the_database(client, settings, dify_server):
    # Deep's local rerank serves the fused order when it passes its deadline; on a loaded machine
    # that happened on one side only and the two orders differed. The comparison is of the
    # backends, so the rerank gets all the time it needs on both.
    settings.KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS = 60000
    files = _files()
    database = _space_with_documents(client, files, "Database")
    expected = {
        (q, mode): _ask(client, database["id"], q, mode)
        for q in QUERIES
        for mode in ("fast", "deep")
    }
    dense = {q: _dense_leg(database["id"], q) for q in QUERIES}
    assert get_search_backend().__class__.__name__ != "DifyBridgeBackend"
    assert not dify_server.calls(VECTORS)

    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_SEARCH_BACKEND = "dify"
    assert isinstance(get_search_backend(), DifyBridgeBackend)
    space = _space_with_documents(client, files, "Bridge")
    nodes = _published(space["id"])
    assert len(nodes) > 64

    # Everything indexed went to Dify, in batches of at most 64 points, with no text beside a
    # vector; the database holds the ledger only (no vector bytes).
    upserts = [c for c in dify_server.calls(VECTORS) if c.body["operation"] == "upsert"]
    text_upserts = [c for c in dify_server.calls(TEXTS) if c.body["operation"] == "upsert"]
    sizes = [len(c.body["points"]) for c in upserts]
    assert max(sizes) == 64 and sum(sizes) == len(nodes)
    assert len(upserts) == math.ceil(len(nodes) / 64)
    assert [len(c.body["points"]) for c in text_upserts] == sizes
    stored = dify_server.bridge.points(space_id=space["id"])
    assert set(stored) == nodes
    assert all(set(p) == {"id", "generation_id", "content_hash", "vector"} for p in stored.values())
    assert set(dify_server.bridge.points(texts=True, space_id=space["id"])) == nodes
    (scope,) = {json.dumps(c.body["scope"], sort_keys=True) for c in upserts}
    assert json.loads(scope) == {
        "tenant_id": str(uuid.uuid5(uuid.NAMESPACE_URL, "knowledgefs:tenant:tenant-a")),
        "knowledge_space_id": space["id"],
        "vector_space_id": vector_space_id(uuid.UUID(space["id"]), 1),
        "kind": "dense",
        "dimension": 384,
    }
    ledger = DenseVector.objects.filter(space_id=space["id"])
    assert ledger.count() == len(nodes)
    assert set(ledger.values_list("vector", flat=True)) == {b""}
    print(
        f"\nindexing {len(nodes)} chunks: {len(upserts)} vector upserts, "
        f"{len(text_upserts)} text upserts"
    )

    # The same results, Fast and Deep. The dense leg is the same exact cosine, and the
    # server's text search is FTS5's BM25 while the SQLite backend's is tantivy's BM25 with
    # FTS5's idf (per-space statistics, Snowball stemming): on SQLite the same passages are
    # cite the same top 3 in the same order, and the fused scores differ a little, so a near tie
    # below them may flip one passage (measured with token-bounded chunks: rank 4 of one query,
    # fused scores within the tolerance below). PostgreSQL's keyword leg ranks with BM25 over
    # its english lexemes, not FTS5's Porter tokens, so there the dense leg is identical and the
    # fused top 5 share at least 3 passages.
    dify_server.reset_observations()
    for (query, mode), theirs in expected.items():
        mine = _ask(client, space["id"], query, mode)
        if connection.vendor == "sqlite":
            assert _cited(mine)[:3] == _cited(theirs)[:3], (query, mode)
            shared = set(_cited(mine)) & set(_cited(theirs))
            assert len(mine) == len(theirs) and len(shared) >= len(theirs) - 1, (query, mode)
            # Fused scores agree within 0.02 (measured: ≤ 1.1e-2 apart; ≤ 3e-3 when both
            # keyword legs were FTS5).
            assert np.allclose([i["score"] for i in mine], [i["score"] for i in theirs], atol=2e-2)
        else:
            assert len(set(_cited(mine)) & set(_cited(theirs))) >= 3, (query, mode)
    for query, theirs in dense.items():
        mine = _dense_leg(space["id"], query)
        assert [c for c, _ in mine] == [c for c, _ in theirs], query
        assert np.allclose([s for _, s in mine], [s for _, s in theirs], atol=1e-5), query
    searches = dify_server.calls(VECTORS) + dify_server.calls(TEXTS)
    assert searches and {c.body["operation"] for c in searches} == {"search"}
    assert all(set(c.body["ids"]) <= nodes for c in searches)
    print(f"{len(QUERIES) * 2} queries: {len(searches)} bridge searches")


# --- authorization, deletes -------------------------------------------------------------------


def test_searches_return_only_authorized_ids_even_when_the_store_holds_others(client, bridge):
    files = _files()
    mine = _space_with_documents(client, {"security.md": files["security.md"]}, "Mine")
    theirs = _space_with_documents(client, {"testing.md": files["testing.md"]}, "Theirs")
    # The other space's points copied into this space's collections: the store holds them, SQL
    # never authorizes them.
    store = bridge.bridge
    with store.lock:
        for points in (store.vectors, store.texts):
            (own,) = [n for n in points if store.scopes[n]["knowledge_space_id"] == mine["id"]]
            (other,) = [n for n in points if store.scopes[n]["knowledge_space_id"] == theirs["id"]]
            points[own].update(points[other])
    foreign = _published(theirs["id"])
    query = "how are tests run against PostgreSQL with pytest"
    for mode in ("fast", "deep"):
        items = _ask(client, mine["id"], query, mode, top_k=20)
        assert items and {i["citation"]["filename"] for i in items} == {"security.md"}
    for call in bridge.calls(VECTORS) + bridge.calls(TEXTS):
        if call.body["operation"] == "search":
            assert not set(call.body["ids"]) & foreign
            assert set(call.body["ids"]) <= _published(mine["id"])


def test_a_deleted_document_is_gone_from_the_store_and_from_results(client, bridge):
    files = _files()
    space = _space_with_documents(client, {k: files[k] for k in ("security.md", "unstructured.md")})
    gone = Document.objects.get(space_id=space["id"], filename="unstructured.md")
    gone_nodes = {
        str(i) for i in KnowledgeNode.objects.filter(document=gone).values_list("id", flat=True)
    }
    assert gone_nodes <= set(bridge.bridge.points(space_id=space["id"]))
    url = f"{SPACES}/{space['id']}/documents/{gone.id}"
    assert client.delete(url).status_code == 204
    deletes = [
        c for c in bridge.calls(VECTORS) + bridge.calls(TEXTS) if c.body["operation"] == "delete"
    ]
    assert {c.route for c in deletes} == {VECTORS, TEXTS}
    assert not gone_nodes & set(bridge.bridge.points(space_id=space["id"]))
    assert not gone_nodes & set(bridge.bridge.points(texts=True, space_id=space["id"]))
    assert not DenseVector.objects.filter(node_id__in=gone_nodes).exists()
    items = _ask(client, space["id"], "the local parser endpoint for PDF files", "fast", 20)
    assert items and {i["citation"]["filename"] for i in items} == {"security.md"}
    # Deleting the space empties what it had in the store.
    assert client.delete(f"{SPACES}/{space['id']}").status_code == 204
    assert not bridge.bridge.points(space_id=space["id"])
    assert not bridge.bridge.points(texts=True, space_id=space["id"])


def test_changing_the_embedding_model_rebuilds_into_a_new_scope_and_purges_the_old(
    settings, bridge, space
):
    from ingestion.documents import admit_document
    from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A, MODEL_B
    from retrieval import index_builds, index_versions

    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    index_versions.change_embedding_model(space, MODEL_A)  # version 1: 8-d
    sections = "\n\n".join(
        f"# Topic {i}\n\nParagraph {i} talks about subject{i} and widget{i % 7}." for i in range(50)
    )
    admit_document(space, filename="fifty.md", data=sections.encode(), enqueue=False)
    compile_all()
    nodes = _published(space.id)
    old = {c: s for c, s in bridge.bridge.collections().items() if s["dimension"] == 8}
    assert len(nodes) == 50 and len(old) == 1
    building = index_versions.change_embedding_model(space, MODEL_B)  # version 2: 4-d, rebuilt
    assert index_builds.rebuild_index_version(building.id, batch_size=16) == "active"
    points_v2 = {
        pid
        for name, points in bridge.bridge.vectors.items()
        if bridge.bridge.scopes[name]["vector_space_id"] == vector_space_id(space.id, 2)
        for pid in points
    }
    assert points_v2 == nodes
    (old_name,) = old
    assert bridge.bridge.vectors[old_name] == {}  # the retired version's points are gone
    assert old[old_name]["vector_space_id"] == vector_space_id(space.id, 1)
    assert not DenseVector.objects.filter(space=space, index_version=1).exists()
    result = retrieve(space, "subject7 widget0", top_k=3)
    assert result.metrics["index_version"] == 2
    assert result.items[0].text == "Topic 7\nParagraph 7 talks about subject7 and widget0."


# --- failures ---------------------------------------------------------------------------------


def test_dify_unavailable_is_a_503_with_a_stable_code(client, bridge):
    space = _space_with_documents(client, {"security.md": _files()["security.md"]})
    bridge.bridge.unavailable = True
    bridge.bridge.retry_after = 0
    answer = client.post(
        f"{SPACES}/{space['id']}/retrieval-tests",
        {"query": "signing key", "mode": "fast"},
        format="json",
    )
    assert answer.status_code == 503, answer.content
    body = answer.json()
    assert body["code"] == "dify_vector_store_unavailable"
    assert body["details"]["dify_code"] in ("VECTOR_STORE_UNAVAILABLE", "TEXT_STORE_UNAVAILABLE")
    assert answer["Retry-After"] == "5"
    # A delete keeps the document whole and says the same.
    document = Document.objects.get(space_id=space["id"])
    deleted = client.delete(f"{SPACES}/{space['id']}/documents/{document.id}")
    assert deleted.status_code == 503 and deleted.json()["code"] == "dify_vector_store_unavailable"
    assert Document.objects.filter(id=document.id).exists()
    assert KnowledgeNode.objects.filter(document=document).exists()
    # Readiness names it; once Dify is back, so is search.
    ok, state, detail = health.check_search()
    assert (ok, state) == (False, "failing") and "VECTOR_STORE_UNAVAILABLE" in detail
    bridge.bridge.unavailable = False
    assert health.check_search() == (True, "ok", "dify: vector and text bridge answered")
    assert _ask(client, space["id"], "signing key", "fast")


def test_quota_exceeded_fails_the_compile_job_with_its_code(client, bridge):
    bridge.bridge.quota_points = 10
    space = client.post(SPACES, {"name": "Quota"}, format="json").json()
    upload(client, KnowledgeSpace(id=space["id"]), "security.md", _files()["security.md"])
    compile_all()
    document = Document.objects.get(space_id=space["id"])
    assert (document.state, document.error_code) == ("failed", "vector_space_quota_exceeded")
    assert "quota" in document.error_message
    assert not DenseVector.objects.filter(space_id=space["id"]).exists()
    assert not _published(space["id"])
    assert not bridge.bridge.points(space_id=space["id"])


def test_dify_backend_needs_the_inner_api_at_start_up():
    env = {
        **os.environ,
        "KNOWLEDGE_SEARCH_BACKEND": "dify",
        "DIFY_INNER_API_URL": "",
        "DIFY_INNER_API_KEY": "",
        "DJANGO_SETTINGS_MODULE": "knowledgefs.settings",
    }
    run = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert (
        "KNOWLEDGE_SEARCH_BACKEND=dify keeps the search index in Dify's vector store and needs "
        "DIFY_INNER_API_URL and DIFY_INNER_API_KEY" in run.stderr
    )
    env["KNOWLEDGE_SEARCH_BACKEND"] = "qdrant"
    run = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "KNOWLEDGE_SEARCH_BACKEND='qdrant' is not one of: database, dify" in run.stderr


# --- the clients against the contract server --------------------------------------------------

SCOPE = VectorScope("tenant-a", str(uuid.UUID(int=7)), "vs-1", "dense", 8)
TEXT_SCOPE = TextScope("tenant-a", str(uuid.UUID(int=7)), "keywords-v1")


def _points(n: int, seed: int = 0) -> list[VectorPoint]:
    rng = np.random.default_rng(seed)
    return [
        VectorPoint(
            str(uuid.UUID(int=1000 + i)), str(uuid.UUID(int=1)), "ab" * 32, rng.normal(size=8)
        )
        for i in range(n)
    ]


def test_the_contract_server_refuses_more_than_64_points(dify_transport):
    points = [
        {"id": str(uuid.UUID(int=i + 1)), "generation_id": str(uuid.UUID(int=1)),
         "content_hash": "ab" * 32, "vector": [1.0] * 8}
        for i in range(65)
    ]  # fmt: skip
    with pytest.raises(VectorStoreError) as refused:
        dify_transport.request(
            "POST", VECTORS, errors=VectorStoreError, timeout=5, max_bytes=1 << 20,
            idempotent=True,
            json_body={"operation": "upsert", "scope": SCOPE.as_json(), "points": points},
        )  # fmt: skip
    assert refused.value.code == "VECTOR_STORE_REQUEST_REJECTED" and refused.value.status == 400


def test_vector_client_batches_chunks_and_merges(dify_server, dify_transport):
    store = DifyVectorStore(transport=dify_transport, concurrency=3)
    points = _points(5000)
    assert store.upsert(SCOPE, points) == math.ceil(5000 / 64)
    upserts = dify_server.calls(VECTORS)
    assert [len(c.body["points"]) for c in upserts] == [64] * 78 + [8]
    query = np.random.default_rng(9).normal(size=8)
    ids = [p.id for p in points]
    found = store.search(SCOPE, query, ids, 10)
    searches = [c for c in dify_server.calls(VECTORS) if c.body["operation"] == "search"]
    assert sorted(len(c.body["ids"]) for c in searches) == [904, 2048, 2048]
    matrix = np.array([p.vector for p in points])
    cosine = matrix @ query / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(query))
    best = [points[i].id for i in np.argsort(-cosine)[:10]]
    assert [m.id for m in found] == best
    assert np.allclose([m.score for m in found], np.sort(cosine)[::-1][:10])
    # Only the authorized ids: the best point left out never comes back.
    rest = store.search(SCOPE, query, [i for i in ids if i != best[0]], 10)
    assert [m.id for m in rest] == best[1:] + [points[np.argsort(-cosine)[10]].id]
    # get ≤ 64 per request; delete ≤ 2048 per request, then nothing is readable.
    assert len(store.get(SCOPE, ids[:100])) == 100
    assert store.delete(SCOPE, ids) == 3
    assert store.get(SCOPE, ids[:100]) == []


def test_vector_client_refuses_bad_input_and_bad_answers(dify_server, dify_transport):
    store = DifyVectorStore(transport=dify_transport)
    with pytest.raises(VectorStoreError, match="all zeros"):
        store.upsert(
            SCOPE, [VectorPoint(str(uuid.UUID(int=5)), str(uuid.UUID(int=1)), "ab" * 32, [0.0] * 8)]
        )
    with pytest.raises(VectorStoreError, match="3 dimensions, the scope 8"):
        store.search(SCOPE, [1.0, 2.0, 3.0], [str(uuid.UUID(int=5))], 5)
    with pytest.raises(VectorStoreError, match="limit must be 1..256"):
        store.search(SCOPE, [1.0] * 8, [str(uuid.UUID(int=5))], 257)
    store.upsert(SCOPE, _points(3))
    ids = [p.id for p in _points(3)]
    bad = [
        ([{"id": str(uuid.UUID(int=99)), "score": 0.5}], "not one of the authorized ids"),
        ([{"id": ids[0], "score": float("inf")}], "not finite"),
        ([{"id": ids[0], "score": 0.5}, {"id": ids[0], "score": 0.4}], "repeated"),
        ([{"id": i, "score": 0.1} for i in ids], "3 matches for a limit of 2"),
    ]
    for matches, message in bad:
        dify_server.add_fault("json", VECTORS, status=200, body={"points": [], "matches": matches})
        with pytest.raises(VectorStoreError, match=message) as invalid:
            store.search(SCOPE, [1.0] * 8, ids, 2)
        assert invalid.value.code == "VECTOR_STORE_RESPONSE_INVALID"


def test_text_client_round_trip_and_quota(dify_server, dify_transport):
    texts = DifyTextStore(transport=dify_transport)
    points = [
        TextPoint(str(uuid.UUID(int=10 + i)), str(uuid.UUID(int=1)), text)
        for i, text in enumerate(["zebra canary lives here", "a horse of another colour", "zebra"])
    ]
    assert texts.upsert(TEXT_SCOPE, points) == 1
    ids = [p.id for p in points]
    found = texts.search(TEXT_SCOPE, "zebra canary", ids, 5)
    assert [m.id for m in found] == [ids[0], ids[2]]
    assert texts.search(TEXT_SCOPE, "zebra canary", ids[1:], 5)[0].id == ids[2]
    assert [p.text for p in texts.get(TEXT_SCOPE, ids)] == [p.text for p in points]
    with pytest.raises(TextStoreError, match="blank"):
        texts.upsert(TEXT_SCOPE, [TextPoint(ids[0], ids[0], "   ")])
    assert texts.delete(TEXT_SCOPE, ids) == 1
    assert texts.get(TEXT_SCOPE, ids) == []
    dify_server.bridge.quota_points = 2
    with pytest.raises(VectorStoreError) as quota:
        DifyVectorStore(transport=dify_transport).upsert(SCOPE, _points(3))
    assert quota.value.code == "VECTOR_SPACE_QUOTA_EXCEEDED" and not quota.value.retryable
