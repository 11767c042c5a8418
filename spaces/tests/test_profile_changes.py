"""Changing a space's embedding model across runtimes, and the preflight's bounds.

- ``PATCH …{"embedding_model_id"}`` names registered local models: under
  ``KNOWLEDGE_MODEL_RUNTIME=dify`` it is refused (400 ``capability_unavailable``) instead of moving
  a Dify space onto the local model;
- a frozen embedding profile whose index holds nothing (a mistyped model: every document failed
  validation) takes another selection; once vectors exist the 409 names what works;
- validation refuses dimensions outside 1..16384 and stops at one overall deadline.

Real database, services, API and Dify clients against the contract server
(``knowledgefs/testing/dify_server.py``).
"""

from __future__ import annotations

import time

import pytest

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, RunState
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import MODEL_CATALOG, TEST_INNER_KEY, TEXT_EMBEDDING
from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.models import IndexVersion
from spaces import preflight
from spaces.models import SpaceProfile
from spaces.selection import local_selection
from spaces.services import create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
TYPO = {**OPENAI, "model": "text-embeding-3-small"}
COHERE_EMBED = {"plugin_id": "langgenius/cohere", "provider": "cohere", "model": "embed-v4.0"}
LEAVE = b"# Leave\n\nEvery employee gets 25 days of annual leave per year."
EXPENSES = b"# Expenses\n\nSubmit travel receipts within thirty days of the trip."
SPACES = "/v1/knowledge-spaces"


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = 1
    dify_server.dimension = 48
    return dify_server


def profile(space) -> SpaceProfile:
    return SpaceProfile.objects.get(space_id=space.id)


def put_embedding(client, space, body):
    return client.put(f"{SPACES}/{space.id}/embedding-profile", body, format="json")


def validate(client, space) -> dict:
    answer = client.post(f"{SPACES}/{space.id}/profile-validation")
    assert answer.status_code == 200, answer.content
    return answer.json()


def ready_dify_space(client, principal, name="Dify"):
    space = create_space(principal, name=name)
    assert put_embedding(client, space, OPENAI).status_code == 200
    assert validate(client, space)["readiness"]["state"] == "ready"
    return space


# --- 1. embedding_model_id follows the runtime ---------------------------------------------------


def test_patch_cannot_move_a_dify_space_onto_a_local_model(dify, client, principal):
    space = ready_dify_space(client, principal)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    assert compile_all() == 1
    before = client.get(f"{SPACES}/{space.id}").json()
    url = f"{SPACES}/{space.id}"
    for model_id in ("local/all-MiniLM-L6-v2-int8-onnx", "no-such-model"):
        refused = client.patch(url, {"embedding_model_id": model_id}, format="json")
        assert refused.status_code == 400, refused.content
        assert refused.json()["code"] == "capability_unavailable"
        assert refused.json()["details"]["field"] == "embedding_model_id"
        assert f"/v1/knowledge-spaces/{space.id}/embedding-profile" in refused.json()["message"]
    after = client.get(url).json()
    assert after["index"] == before["index"] and after["revision"] == before["revision"]
    assert after["embedding_profile"] == before["embedding_profile"]
    assert IndexVersion.objects.filter(space=space).count() == 1
    # The model already in use (the profile's vector space id) is a no-op, not an error.
    same = client.patch(
        url, {"embedding_model_id": before["index"]["active"]["model_id"]}, format="json"
    )
    assert same.status_code == 200, same.content
    assert same.json()["index"] == before["index"]


def test_an_empty_dify_space_cannot_adopt_a_local_model_either(dify, client, principal):
    space = create_space(principal, name="Empty")
    refused = client.patch(
        f"{SPACES}/{space.id}",
        {"embedding_model_id": "local/all-MiniLM-L6-v2-int8-onnx"},
        format="json",
    )
    assert refused.status_code == 400 and refused.json()["code"] == "capability_unavailable"
    assert profile(space).state == "setup-required" and not profile(space).embedding_plugin_id
    assert not IndexVersion.objects.filter(space=space).exists()


def test_the_local_runtime_still_reindexes_with_registered_models(client, space, settings):
    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    url = f"{SPACES}/{space.id}"
    unknown = client.patch(url, {"embedding_model_id": "embedding-space-sha256:00"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_embedding_model"
    started = client.patch(url, {"embedding_model_id": MODEL_A}, format="json")
    assert started.status_code in (200, 202), started.content
    assert started.json()["index"]["building"]["model_id"] == MODEL_A
    # A frozen local profile with vectors points at that route.
    frozen = put_embedding(client, space, local_selection(MODEL_A).as_dict())
    assert frozen.status_code == 409 and frozen.json()["code"] == "embedding_profile_frozen"
    assert "embedding_model_id" in frozen.json()["message"]


# --- 2. a frozen profile that indexed nothing ----------------------------------------------------


def test_a_mistyped_model_can_be_replaced_after_every_document_failed(dify, client, principal):
    space = create_space(principal, name="Typo")
    put_embedding(client, space, TYPO)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    job = CompilationJob.objects.get(space=space)
    assert (job.run_state, job.error_code) == (RunState.FAILED, "model_not_found")
    stuck = profile(space)
    assert stuck.state == "validation-failed" and stuck.embedding_frozen_at is not None

    fixed = put_embedding(client, space, {**OPENAI, "revision": stuck.embedding_revision})
    assert fixed.status_code == 200, fixed.content
    body = fixed.json()
    assert body["readiness"]["state"] == "pending-validation"
    assert body["readiness"]["failure"] is None
    assert body["embedding_profile"]["model"] == OPENAI["model"]
    assert body["embedding_profile"]["frozen_at"] is not None  # the latch stays
    assert body["embedding_profile"]["revision"] == stuck.embedding_revision + 1

    assert upload(client, space, "expenses.md", EXPENSES).status_code == 202
    compile_all()
    assert profile(space).state == "ready"
    version = IndexVersion.objects.get(space=space, state="active")
    assert version.model_id == profile(space).vector_space_id and version.dimension == 48
    hits = client.post(
        f"{SPACES}/{space.id}/retrieval-tests", {"query": "travel receipts"}, format="json"
    ).json()
    assert hits["items"][0]["citation"]["filename"] == "expenses.md"


def test_once_vectors_exist_the_409_names_what_works_under_dify(dify, client, principal):
    space = ready_dify_space(client, principal)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    assert compile_all() == 1
    refused = put_embedding(client, space, COHERE_EMBED)
    assert refused.status_code == 409 and refused.json()["code"] == "embedding_profile_frozen"
    message = refused.json()["message"]
    assert "embedding_model_id" not in message  # that route 400s under dify
    assert "not supported yet" in message and "new space" in message
    assert profile(space).embedding_model == OPENAI["model"]


# --- 3. the dimension bound -----------------------------------------------------------------------


def test_a_dimension_outside_the_bound_fails_validation(dify, client, principal):
    space = create_space(principal, name="Huge")
    put_embedding(client, space, OPENAI)
    dify.add_fault("dimension", TEXT_EMBEDDING, dimension=preflight.MAX_EMBEDDING_DIMENSION + 1,
                   times=None)  # fmt: skip
    readiness = validate(client, space)["readiness"]
    assert readiness["state"] == "validation-failed"
    failure = readiness["failure"]
    assert (failure["code"], failure["field"], failure["retryable"]) == (
        "embedding_dimension_out_of_range",
        "embedding",
        False,
    )
    assert str(preflight.MAX_EMBEDDING_DIMENSION) in failure["message"]
    assert profile(space).embedding_dimension is None
    dify.clear_faults()
    dify.dimension = preflight.MAX_EMBEDDING_DIMENSION  # the bound itself is accepted
    readiness = validate(client, space)["readiness"]
    assert readiness["state"] == "ready", readiness
    assert profile(space).embedding_dimension == preflight.MAX_EMBEDDING_DIMENSION


# --- 4. the preflight's deadline and page cap -----------------------------------------------------


def test_validation_stops_at_its_deadline_leaving_the_state(dify, client, principal, monkeypatch):
    space = create_space(principal, name="Slow")
    put_embedding(client, space, OPENAI)
    monkeypatch.setattr(preflight, "PREFLIGHT_DEADLINE_SECONDS", 0.3)
    dify.delay(0.4, route=MODEL_CATALOG, times=None)
    started = time.monotonic()
    readiness = validate(client, space)["readiness"]
    assert time.monotonic() - started < 5
    assert readiness["state"] == "pending-validation"
    failure = readiness["failure"]
    assert (failure["code"], failure["field"], failure["retryable"]) == (
        "model_runtime_timeout",
        "embedding",
        True,
    )
    assert dify.count(TEXT_EMBEDDING) == 0  # no probe was started after the deadline
    dify.clear_faults()
    monkeypatch.setattr(preflight, "PREFLIGHT_DEADLINE_SECONDS", 20.0)
    assert validate(client, space)["readiness"]["state"] == "ready"


def test_a_catalog_lookup_reads_a_bounded_number_of_pages(dify, client, principal, monkeypatch):
    space = create_space(principal, name="Paged")
    put_embedding(client, space, {**OPENAI, "model": "not-in-the-catalog"})
    endless = {
        "data": {"items": [], "next_offset": 1},
        "error": "",
    }
    dify.add_fault("json", MODEL_CATALOG, status=200, body=endless, times=None)
    readiness = validate(client, space)["readiness"]
    assert readiness["failure"]["code"] == "model_not_found"
    # One budget for the lookup, across the wanted type and the other two.
    assert dify.count(MODEL_CATALOG) == preflight.CATALOG_MAX_PAGES
