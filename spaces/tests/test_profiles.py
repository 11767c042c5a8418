"""Space profiles: embedding and retrieval profiles, their rules, the freeze, and the preflight.

Everything is real: the database, the services, the API, the compiler, and the Dify clients
talking HTTP to the local contract server (``knowledgefs/testing/dify_server.py``), whose faults
stand in for a missing model, refused credentials, a Dify that is down and a model answering another
dimension.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from ingestion.compilation.recovery import drain_queued
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, DocumentState, RunState
from knowledgefs.errors import InvalidInput
from knowledgefs.runtime import (
    DEFAULT_MODEL_ID,
    MINILM_MODEL_ID,
    UnknownEmbeddingModel,
    get_embedding_model,
)
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import (
    LLM,
    MODEL_CATALOG,
    RERANK,
    TEST_INNER_KEY,
    TEXT_EMBEDDING,
)
from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A, MODEL_B
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval import index_builds, index_versions
from retrieval.models import IndexVersion
from retrieval.modes import retrieve
from spaces import profiles
from spaces.api_keys import create_api_key
from spaces.models import KnowledgeSpace, SpaceProfile
from spaces.selection import Selection, local_identity, local_selection, vector_space_id
from spaces.services import create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
COHERE_EMBED = {"plugin_id": "langgenius/cohere", "provider": "cohere", "model": "embed-v4.0"}
RERANKER = {"plugin_id": "langgenius/cohere", "provider": "cohere", "model": "rerank-v3.5"}
REASONER = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
OPENAI_INSTALL = "langgenius/openai:1.0.0@sha256:abc"
LEAVE = b"# Leave\n\nEvery employee gets 25 days of annual leave per year."
EXPENSES = b"# Expenses\n\nSubmit travel receipts within thirty days of the trip."
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


def new_space(principal, name="Profiled") -> KnowledgeSpace:
    return create_space(principal, name=name)


def profile(space) -> SpaceProfile:
    return SpaceProfile.objects.get(space_id=space.id)


def described(space) -> dict:
    return profiles.describe(profile(space))


def put(client, space, which: str, body: dict):
    return client.put(f"{SPACES}/{space.id}/{which}-profile", body, format="json")


def kfs(*args: str) -> str:
    out = StringIO()
    call_command("kfs", *args, stdout=out)
    return out.getvalue()


# --- the local runtime (embedded default) ---------------------------------------------------------


def test_a_local_space_is_ready_with_the_local_profile_and_no_network(client):
    body = client.post(SPACES, {"name": "Local"}, format="json").json()
    assert body["readiness"]["state"] == "ready" and body["readiness"]["failure"] is None
    embedding = body["embedding_profile"]
    assert (embedding["plugin_id"], embedding["provider"], embedding["model"]) == (
        "local",
        "local",
        DEFAULT_MODEL_ID,
    )
    selection = local_selection()
    assert embedding["vector_space_id"] == vector_space_id(
        selection, {"model_id": DEFAULT_MODEL_ID}
    )
    assert embedding["vector_space_id"].startswith("embedding-space-sha256:")
    assert len(embedding["vector_space_id"]) == len("embedding-space-sha256:") + 64
    assert embedding["frozen_at"] is None and embedding["revision"] == 1
    assert body["retrieval_profile"] == {
        "default_mode": "fast",
        "reasoning_model": None,
        "rerank": {"enabled": False, "model": None},
        "score_threshold": None,
        "top_k": 10,
        "revision": 1,
    }
    space = KnowledgeSpace.objects.get(id=body["id"])
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    assert compile_all() == 1
    assert retrieve(space, "annual leave").items[0].citation["filename"] == "leave.md"
    frozen = client.get(f"{SPACES}/{space.id}").json()["embedding_profile"]
    assert frozen["frozen_at"] is not None and frozen["dimension"] == 384


def test_the_local_runtime_refuses_dify_models_naming_the_field(client, space):
    refused = put(client, space, "embedding", OPENAI)
    assert refused.status_code == 400
    assert refused.json()["code"] == "capability_unavailable"
    assert refused.json()["message"].startswith("embedding.plugin_id:")
    for body, field in (
        ({"rerank": {"enabled": True, "model": RERANKER}}, "rerank"),
        ({"rerank": {"enabled": False, "model": RERANKER}}, "rerank"),
        ({"reasoning_model": REASONER}, "reasoning"),
    ):
        answer = put(client, space, "retrieval", body)
        assert answer.status_code == 400, body
        assert answer.json()["code"] == "capability_unavailable"
        assert answer.json()["details"]["field"] == field
    local_rerank = {"plugin_id": "local", "provider": "local", "model": "x"}
    answer = put(client, space, "retrieval", {"rerank": {"enabled": True, "model": local_rerank}})
    assert answer.json()["code"] == "capability_unavailable"
    assert profile(space).retrieval_revision == 1  # nothing changed


def test_a_local_space_takes_another_registered_model_before_its_first_document(
    client, space, settings
):
    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    unknown = put(client, space, "embedding", {**local_selection().as_dict(), "model": "x"})
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_embedding_model"
    assert MODEL_A in unknown.json()["details"]["registered"]
    chosen = put(client, space, "embedding", local_selection(MODEL_A).as_dict())
    assert chosen.status_code == 200, chosen.content
    assert chosen.json()["readiness"]["state"] == "ready"
    assert chosen.json()["embedding_profile"]["model"] == MODEL_A
    assert chosen.json()["embedding_profile"]["revision"] == 2
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    version = IndexVersion.objects.get(space=space, state="active")
    assert (version.model_id, version.dimension) == (MODEL_A, 8)
    assert profile(space).embedding_dimension == 8


def test_patch_before_the_first_upload_and_a_cutover_keep_the_profile_on_the_active_model(
    client, space, settings
):
    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    url = f"{SPACES}/{space.id}"
    chosen = client.patch(url, {"embedding_model_id": MODEL_A}, format="json").json()
    assert chosen["embedding_profile"]["model"] == MODEL_A
    assert chosen["embedding_profile"]["dimension"] == 8
    # A PUT before any upload wins: the empty version 1 of the PATCH is retired.
    put(client, space, "embedding", local_selection(MODEL_B).as_dict())
    assert not IndexVersion.objects.filter(space=space, state="active").exists()
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    assert IndexVersion.objects.get(space=space, state="active").model_id == MODEL_B
    # After the freeze a model change is a re-index; the profile follows the cutover.
    version = index_versions.change_embedding_model(space, MODEL_A)
    assert profile(space).embedding_model == MODEL_B
    index_builds.rebuild_index_version(version.id)
    after = client.get(url).json()
    assert after["index"]["active"]["model_id"] == MODEL_A
    assert (after["embedding_profile"]["model"], after["embedding_profile"]["dimension"]) == (
        MODEL_A,
        8,
    )
    assert after["embedding_profile"]["frozen_at"] is not None
    assert after["readiness"]["state"] == "ready"


# --- the embedding profile and its freeze -------------------------------------------------------


def test_a_dify_space_needs_setup_before_uploads_and_queries(dify, client, principal):
    space = new_space(principal)
    body = client.get(f"{SPACES}/{space.id}").json()
    assert body["readiness"]["state"] == "setup-required"
    assert body["embedding_profile"]["plugin_id"] is None
    refused = upload(client, space, "leave.md", LEAVE)
    assert refused.status_code == 409 and refused.json()["code"] == "space_setup_required"
    assert "embedding-profile" in refused.json()["message"]
    assert not Document.objects.filter(space=space).exists()
    query = client.post(f"{SPACES}/{space.id}/retrieval-tests", {"query": "x"}, format="json")
    assert query.status_code == 409 and query.json()["code"] == "space_setup_required"
    assert dify.requests == []  # nothing asked Dify


def test_embedding_selections_are_checked_member_by_member(dify, client, principal):
    space = new_space(principal)
    cases = [
        ({**OPENAI, "plugin_id": "OpenAI"}, "invalid_model_selection", "embedding.plugin_id"),
        ({**OPENAI, "plugin_id": "langgenius"}, "invalid_model_selection", "embedding.plugin_id"),
        ({**OPENAI, "provider": "Open AI"}, "invalid_model_selection", "embedding.provider"),
        ({**OPENAI, "model": ""}, "invalid_model_selection", "embedding.model"),
        # U+0000 is refused by the JSON parser for every body (knowledgefs/parsers.py)
        ({**OPENAI, "model": "a\x00b"}, "invalid_request", "model"),
        ({**OPENAI, "model": "a\x01b"}, "invalid_model_selection", "embedding.model"),
        ({"plugin_id": "langgenius/openai", "provider": "openai"}, "invalid_model_selection",
         "embedding.model"),
        ({**OPENAI, "dimension": 1536}, "invalid_model_selection", "embedding.dimension"),
        ({**OPENAI, "api_key": "sk-secret"}, "invalid_model_selection", "embedding.api_key"),
        ({**OPENAI, "vector_space_id": "x"}, "invalid_model_selection",
         "embedding.vector_space_id"),
        (local_selection().as_dict(), "capability_unavailable", "embedding.plugin_id"),
    ]  # fmt: skip
    for body, code, field in cases:
        answer = put(client, space, "embedding", body)
        assert answer.status_code == 400, body
        assert (answer.json()["code"], answer.json()["details"]["field"]) == (code, field), body
        assert answer.json()["message"].startswith(field), answer.json()
        assert "sk-secret" not in answer.content.decode()
    assert profile(space).embedding_revision == 1
    bad_revision = put(client, space, "embedding", {**OPENAI, "revision": "2"})
    assert bad_revision.status_code == 400 and bad_revision.json()["code"] == "invalid_request"


def test_a_selection_is_pending_validation_compare_and_set_and_frozen_by_the_first_upload(
    dify, client, principal
):
    space = new_space(principal)
    chosen = put(client, space, "embedding", {**OPENAI, "revision": 1})
    assert chosen.status_code == 200, chosen.content
    body = chosen.json()
    assert body["readiness"]["state"] == "pending-validation"
    assert body["embedding_profile"] == {
        **OPENAI,
        "model_identity": None,
        "dimension": None,
        "vector_space_id": None,
        "revision": 2,
        "frozen_at": None,
    }
    assert put(client, space, "embedding", OPENAI).json()["embedding_profile"]["revision"] == 2
    stale = put(client, space, "embedding", {**COHERE_EMBED, "revision": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "revision_conflict"
    assert stale.json()["details"] == {"revision": 2}
    assert put(client, space, "embedding", {**COHERE_EMBED, "revision": 2}).status_code == 200
    assert put(client, space, "embedding", OPENAI).json()["embedding_profile"]["revision"] == 4

    # A space pending validation admits documents (its compilation validates it) and freezes.
    admitted = upload(client, space, "leave.md", LEAVE)
    assert admitted.status_code == 202, admitted.content
    frozen_at = profile(space).embedding_frozen_at
    assert frozen_at is not None
    same = put(client, space, "embedding", OPENAI)  # the same selection again: a no-op
    assert same.status_code == 200 and same.json()["embedding_profile"]["revision"] == 4
    # Frozen, but nothing is indexed yet, so another selection is still accepted (a mistyped
    # model stays fixable); the latch stays set. The 409 once vectors exist:
    # spaces/tests/test_profile_changes.py.
    client.delete(f"{SPACES}/{space.id}/documents/{admitted.json()['document']['id']}")
    moved = put(client, space, "embedding", COHERE_EMBED)
    assert moved.status_code == 200 and moved.json()["embedding_profile"]["revision"] == 5
    assert profile(space).embedding_frozen_at == frozen_at
    assert profile(space).embedding_model == COHERE_EMBED["model"]
    assert dify.requests == []  # choosing is free: validation happens later


# --- the retrieval profile and its rules ---------------------------------------------------------


RULES = [
    ({"default_mode": "auto"}, "mode_unavailable", "default_mode"),
    ({"default_mode": "hybrid"}, "invalid_mode", "default_mode"),
    ({"default_mode": 1}, "invalid_mode", "default_mode"),
    ({"top_k": 0}, "invalid_top_k", "top_k"),
    ({"top_k": 101}, "invalid_top_k", "top_k"),
    ({"top_k": "5"}, "invalid_top_k", "top_k"),
    ({"top_k": True}, "invalid_top_k", "top_k"),
    ({"top_k": 2.5}, "invalid_top_k", "top_k"),
    ({"score_threshold": -0.01, "rerank": {"enabled": True, "model": RERANKER}},
     "invalid_score_threshold", "score_threshold"),
    ({"score_threshold": 1.01, "rerank": {"enabled": True, "model": RERANKER}},
     "invalid_score_threshold", "score_threshold"),
    ({"score_threshold": "0.5"}, "invalid_score_threshold", "score_threshold"),
    ({"score_threshold": True}, "invalid_score_threshold", "score_threshold"),
    ({"score_threshold": 0.5}, "score_threshold_requires_rerank", "score_threshold"),
    ({"score_threshold": 0, "rerank": {"enabled": False, "model": RERANKER}},
     "score_threshold_requires_rerank", "score_threshold"),
    # Whatever the default mode: the profile's threshold also applies to fast/deep requests.
    ({"default_mode": "research", "score_threshold": 0.5}, "score_threshold_requires_rerank",
     "score_threshold"),
    ({"default_mode": "deep", "score_threshold": 0.5}, "score_threshold_requires_rerank",
     "score_threshold"),
    ({"rerank": {"enabled": True}}, "rerank_model_required", "rerank.model"),
    ({"rerank": {"enabled": True, "model": None}}, "rerank_model_required", "rerank.model"),
    ({"rerank": {"enabled": "yes", "model": RERANKER}}, "invalid_rerank", "rerank.enabled"),
    ({"rerank": [RERANKER]}, "invalid_rerank", "rerank"),
    ({"rerank": {"enabled": True, "model": RERANKER, "top_n": 3}}, "invalid_rerank", "rerank"),
    ({"rerank": {"enabled": True, "model": {**RERANKER, "api_key": "k"}}},
     "invalid_model_selection", "rerank.api_key"),
    ({"rerank": {"enabled": True, "model": {**RERANKER, "plugin_id": "cohere"}}},
     "invalid_model_selection", "rerank.plugin_id"),
    ({"reasoning_model": "gpt-4.1"}, "invalid_model_selection", "reasoning"),
    ({"reasoning_model": {**REASONER, "model": " "}}, "invalid_model_selection",
     "reasoning.model"),
    ({"topK": 5}, "invalid_request", "topK"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "code", "field"), RULES)
def test_each_retrieval_profile_rule(dify, client, principal, body, code, field):
    space = new_space(principal)
    answer = put(client, space, "retrieval", body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == code
    assert answer.json()["details"]["field"] == field
    assert profile(space).retrieval_revision == 1


def test_the_limits_themselves_are_accepted_and_nan_is_not(dify, principal):
    space = new_space(principal)
    for body in (
        {"top_k": 1},
        {"top_k": 100},
        {"score_threshold": 0, "rerank": {"enabled": True, "model": RERANKER}},
        {"score_threshold": 1, "rerank": {"enabled": True, "model": RERANKER}},
        {"score_threshold": None},
        {"rerank": None},
        {"rerank": {"enabled": False, "model": RERANKER}},  # kept, not used
    ):
        profiles.set_retrieval_profile(principal, space.id, body)
    with pytest.raises(InvalidInput) as error:
        profiles.set_retrieval_profile(principal, space.id, {"score_threshold": float("nan")})
    assert error.value.code == "invalid_score_threshold"


def test_a_retrieval_profile_is_replaced_with_compare_and_set(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    full = {
        "default_mode": "fast",
        "reasoning_model": REASONER,
        "rerank": {"enabled": True, "model": RERANKER},
        "score_threshold": 0.25,
        "top_k": 7,
    }
    answer = put(client, space, "retrieval", {**full, "revision": 1})
    assert answer.status_code == 200, answer.content
    assert answer.json()["retrieval_profile"] == {**full, "revision": 2}
    assert put(client, space, "retrieval", full).json()["retrieval_profile"]["revision"] == 2
    stale = put(client, space, "retrieval", {"top_k": 3, "revision": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "revision_conflict"
    # PUT replaces: members left out take their defaults.
    replaced = put(client, space, "retrieval", {"top_k": 3, "revision": 2}).json()
    assert replaced["retrieval_profile"] == {
        "default_mode": "fast",
        "reasoning_model": None,
        "rerank": {"enabled": False, "model": None},
        "score_threshold": None,
        "top_k": 3,
        "revision": 3,
    }


def test_the_database_refuses_what_the_rules_refuse(dify, principal):
    space = new_space(principal)
    for fields in (
        {"retrieval_top_k": 0},
        {"retrieval_top_k": 101},
        {"retrieval_score_threshold": 1.5},
        {"retrieval_rerank_enabled": True, "retrieval_rerank_model": None},
        {"state": "ok"},
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            SpaceProfile.objects.filter(space_id=space.id).update(**fields)


# --- the preflight -----------------------------------------------------------------------------


def test_validation_records_the_observed_dimension_and_vector_space(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    answer = client.post(f"{SPACES}/{space.id}/profile-validation")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["readiness"]["state"] == "ready" and body["readiness"]["failure"] is None
    embedding = body["embedding_profile"]
    assert embedding["dimension"] == 48  # what the server answered; nobody configured it
    assert embedding["model_identity"] == OPENAI_INSTALL
    selection = Selection(**OPENAI)
    identity = {
        "plugin_unique_identifier": OPENAI_INSTALL,
        "dimension": 48,
        "distance_metric": "cosine",
    }
    assert embedding["vector_space_id"] == vector_space_id(selection, identity)
    catalog = dify.calls(MODEL_CATALOG)
    assert [c.body["model_type"] for c in catalog] == ["text-embedding"]
    assert catalog[0].body["provider"] == "langgenius/openai/openai"
    probes = dify.calls(TEXT_EMBEDDING)
    assert [c.body["input_type"] for c in probes] == ["document", "query"]
    assert {c.body["tenant_id"] for c in probes + catalog} == {space.tenant_id}
    # Another model or another dimension is another vector space.
    assert vector_space_id(selection, {**identity, "dimension": 64}) != embedding[
        "vector_space_id"]  # fmt: skip
    other = Selection(**COHERE_EMBED)
    assert vector_space_id(other, identity) != embedding["vector_space_id"]
    # Nothing was indexed before a document: the first upload creates version 1 from it.
    assert not IndexVersion.objects.filter(space=space).exists()
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    version = IndexVersion.objects.get(space=space, state="active")
    assert (version.model_id, version.dimension) == (embedding["vector_space_id"], 48)


def test_rerank_and_reasoning_models_are_validated_with_one_real_call_each(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    body = {"rerank": {"enabled": True, "model": RERANKER}, "reasoning_model": REASONER}
    put(client, space, "retrieval", body)
    ready = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert ready["readiness"]["state"] == "ready", ready["readiness"]
    assert sorted(c.body["model_type"] for c in dify.calls(MODEL_CATALOG)) == [
        "llm",
        "rerank",
        "text-embedding",
    ]
    assert len(dify.calls(RERANK)) == 1 and len(dify.calls(LLM)) == 1
    capabilities = profile(space).capabilities
    assert (
        capabilities["rerank"]["plugin_unique_identifier"] == "langgenius/cohere:1.0.0@sha256:abc"
    )
    # A validated rerank model stays valid when only top_k changes.
    put(client, space, "retrieval", {**body, "top_k": 4})
    assert profile(space).state == "ready"
    # A new model is not validated yet.
    other = {**REASONER, "model": "o4-mini"}
    put(client, space, "retrieval", {**body, "reasoning_model": other})
    assert profile(space).state == "pending-validation"


FAILURES = [
    # (what the server does, selection, failure code, field, retryable)
    ("missing", {**OPENAI, "model": "text-embedding-9"}, "model_not_found", "embedding", False),
    ("type", {**RERANKER}, "model_type_mismatch", "embedding", False),
    ("401", OPENAI, "credential_invalid", "embedding", False),
    ("403", OPENAI, "credential_invalid", "embedding", False),
    ("503", OPENAI, "model_runtime_unavailable", "embedding", True),
    ("catalog-503", OPENAI, "model_runtime_unavailable", "embedding", True),
    ("dimension", OPENAI, "embedding_dimension_mismatch", "embedding", False),
    ("envelope", OPENAI, "model_invocation_failed", "embedding", False),
]


@pytest.mark.parametrize(("fault", "selection", "code", "field", "retryable"), FAILURES)
def test_a_failed_validation_is_recorded_on_the_space(
    dify, client, principal, fault, selection, code, field, retryable
):
    space = new_space(principal)
    put(client, space, "embedding", selection)
    if fault in ("401", "403", "503"):
        dify.fail_next(5, status=int(fault), route=TEXT_EMBEDDING)
    elif fault == "catalog-503":
        dify.fail_next(5, status=503, route=MODEL_CATALOG)
    elif fault == "dimension":
        dify.add_fault("dimension", TEXT_EMBEDDING, dimension=32)  # the document probe only
    elif fault == "envelope":
        dify.add_fault("envelope", TEXT_EMBEDDING, message="model is disabled")
    answer = client.post(f"{SPACES}/{space.id}/profile-validation")
    assert answer.status_code == 200, answer.content
    readiness = answer.json()["readiness"]
    failure = readiness["failure"]
    assert (failure["code"], failure["field"], failure["retryable"]) == (code, field, retryable)
    assert failure["message"] and failure["failed_at"]
    assert TEST_INNER_KEY not in answer.content.decode()
    if retryable:
        # Dify may come back: the space stays pending and keeps admitting documents.
        assert readiness["state"] == "pending-validation"
        assert upload(client, space, "leave.md", LEAVE).status_code == 202
        dify.clear_faults()
        again = client.post(f"{SPACES}/{space.id}/profile-validation").json()
        assert again["readiness"] == {**again["readiness"], "state": "ready", "failure": None}
    else:
        assert readiness["state"] == "validation-failed"
        refused = upload(client, space, "leave.md", LEAVE)
        assert refused.status_code == 409
        assert refused.json()["code"] == "space_validation_failed"
        assert refused.json()["details"]["failure"]["code"] == code
        query = client.post(f"{SPACES}/{space.id}/retrieval-tests", {"query": "x"}, format="json")
        assert query.status_code == 409 and query.json()["code"] == "space_validation_failed"


def test_rerank_and_reasoning_failures_name_their_field(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    put(client, space, "retrieval", {"rerank": {"enabled": True, "model": RERANKER}})
    dify.fail_next(1, status=401, route=RERANK)
    failure = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert (failure["state"], failure["failure"]["code"], failure["failure"]["field"]) == (
        "validation-failed",
        "credential_invalid",
        "rerank",
    )
    # Turning the failed reranker off makes the space worth validating again.
    put(client, space, "retrieval", {"rerank": {"enabled": False, "model": None}})
    assert profile(space).state == "pending-validation"
    put(client, space, "retrieval", {"reasoning_model": REASONER})
    dify.add_fault("frame_error", LLM, message="quota exceeded")
    failure = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert (failure["failure"]["code"], failure["failure"]["field"]) == (
        "model_invocation_failed",
        "reasoning",
    )
    put(client, space, "retrieval", {"reasoning_model": {**REASONER, "model": "gpt-9"}})
    failure = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert (failure["failure"]["code"], failure["failure"]["field"]) == (
        "model_not_found",
        "reasoning",
    )


def test_a_rerank_score_outside_zero_to_one_fails_validation(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    put(client, space, "retrieval", {"rerank": {"enabled": True, "model": RERANKER}})
    body = {"data": {"docs": [{"index": 0, "score": 7.5, "text": "x"}]}, "error": ""}
    dify.add_fault("json", RERANK, status=200, body=body)
    failure = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert failure["failure"]["code"] == "rerank_score_out_of_range"


def test_revalidating_a_frozen_space_checks_dimension_and_install(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    client.post(f"{SPACES}/{space.id}/profile-validation")
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    assert compile_all() == 1
    recorded = profile(space)
    # The model now answers another dimension: the index's vectors are no longer comparable.
    dify.add_fault("dimension", TEXT_EMBEDDING, dimension=32, times=None)
    failed = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert failed["state"] == "validation-failed"
    assert failed["failure"]["code"] == "embedding_dimension_mismatch"
    assert profile(space).embedding_dimension == recorded.embedding_dimension == 48
    dify.clear_faults()
    assert client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"][
        "state"] == "ready"  # fmt: skip
    # The plugin was upgraded in place: another install identity is another vector space.
    upgraded = {
        "data": {
            "items": [
                {
                    **OPENAI,
                    "model_type": "text-embedding",
                    "capabilities": {},
                    "plugin_unique_identifier": "langgenius/openai:2.0.0@sha256:def",
                }
            ],
            "next_offset": None,
        },
        "error": "",
    }
    dify.add_fault("json", MODEL_CATALOG, status=200, body=upgraded)
    failed = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert failed["failure"]["code"] == "model_identity_changed"
    assert profile(space).vector_space_id == recorded.vector_space_id


def test_nothing_to_validate_without_a_selection(dify, client, principal):
    space = new_space(principal)
    answer = client.post(f"{SPACES}/{space.id}/profile-validation")
    assert answer.status_code == 409 and answer.json()["code"] == "space_setup_required"


def test_a_local_profile_is_validated_without_the_network(client, space):
    answer = client.post(f"{SPACES}/{space.id}/profile-validation")
    assert answer.json()["readiness"]["state"] == "ready"
    assert answer.json()["embedding_profile"]["dimension"] == 384


# --- the preflight inside the compilation job -------------------------------------------------


def test_the_first_compilation_validates_the_space_under_its_lease(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    admit_document(space, filename="expenses.md", data=EXPENSES, enqueue=False)
    assert not IndexVersion.objects.filter(space=space).exists()
    assert compile_all() == 2
    assert set(Document.objects.filter(space=space).values_list("state", flat=True)) == {
        DocumentState.PUBLISHED
    }
    ready = profile(space)
    assert (ready.state, ready.embedding_dimension) == ("ready", 48)
    version = IndexVersion.objects.get(space=space, state="active")
    assert (version.model_id, version.dimension) == (ready.vector_space_id, 48)
    assert len(dify.calls(MODEL_CATALOG)) == 1  # validated once for the whole batch
    result = retrieve(space, "annual leave days per employee", top_k=2, legs=("dense",))
    assert result.items[0].citation["filename"] == "leave.md"
    model = get_embedding_model(version.model_id, space=space)
    assert model is get_embedding_model(version.model_id, space=space.id)  # pooled
    assert (model.model_id, model.dimension, model.tenant_id) == (
        ready.vector_space_id,
        48,
        space.tenant_id,
    )


def test_a_compilation_fails_for_good_on_a_terminal_validation_failure(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", {**OPENAI, "model": "text-embedding-9"})
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    job = CompilationJob.objects.get(space=space)
    assert (job.run_state, job.error_code, job.error_retryable) == (
        RunState.FAILED,
        "model_not_found",
        False,
    )
    assert "profile-validation" in job.error_message
    assert profile(space).state == "validation-failed"
    assert Document.objects.get(space=space).state == DocumentState.FAILED
    # Further uploads are refused until the profile is fixed.
    assert upload(client, space, "expenses.md", EXPENSES).json()["code"] == (
        "space_validation_failed"
    )


def test_a_compilation_retries_while_dify_is_down_and_then_succeeds(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    admitted = admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    dify.fail_next(3, status=503, route=MODEL_CATALOG)  # the inline retries spend all three
    drain_queued(wait_for_retries=False)
    job = CompilationJob.objects.get(id=admitted.job.id)
    assert (job.run_state, job.error_code, job.error_retryable) == (
        RunState.RETRY_WAIT,
        "model_runtime_unavailable",
        True,
    )
    assert job.execution_attempts == 1
    recorded = profile(space)
    assert recorded.state == "pending-validation" and recorded.failure["retryable"] is True
    drain_queued()  # waits out the back-off, then compiles
    job.refresh_from_db()
    assert job.run_state == RunState.SUCCEEDED
    assert profile(space).state == "ready" and profile(space).failure is None


def test_a_space_that_became_unfit_fails_its_jobs_without_asking_dify(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    SpaceProfile.objects.filter(space_id=space.id).update(
        state="validation-failed",
        failure={"code": "credential_invalid", "message": "refused", "field": "embedding",
                 "retryable": False, "failed_at": "2026-01-01T00:00:00+00:00"},
    )  # fmt: skip
    compile_all()
    job = CompilationJob.objects.get(space=space)
    assert (job.run_state, job.error_code) == (RunState.FAILED, "credential_invalid")
    assert dify.requests == []


# --- retrieval with the profile ---------------------------------------------------------------


def test_retrieval_takes_the_profiles_defaults_and_reranks_through_dify(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    for name, data in (
        ("leave.md", LEAVE),
        ("expenses.md", EXPENSES),
        (
            "travel.md",
            b"# Travel\n\nBook trains for trips under four hours; annual passes are refunded.",
        ),
    ):
        admit_document(space, filename=name, data=data, enqueue=False)
    compile_all()
    url = f"{SPACES}/{space.id}/retrieval-tests"
    plain = client.post(url, {"query": "annual leave days"}, format="json").json()
    assert len(plain["items"]) == 3 and "rerank" not in plain["items"][0]["scores"]
    put(client, space, "retrieval", {"top_k": 2, "score_threshold": 0.5,
                                     "rerank": {"enabled": True, "model": RERANKER}})  # fmt: skip
    refused = client.post(url, {"query": "annual leave days"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "space_pending_validation"
    client.post(f"{SPACES}/{space.id}/profile-validation")
    dify.reset_observations()
    reranked = client.post(url, {"query": "annual leave days"}, format="json").json()
    # The profile's top_k (2) and threshold (0.5, on the rerank score) apply.
    assert [i["citation"]["filename"] for i in reranked["items"]] == ["leave.md"]
    item = reranked["items"][0]
    assert item["score"] == item["scores"]["rerank"] == item["scores"]["final"] == 1.0
    calls = dify.calls(RERANK)
    assert len(calls) == 1 and len(calls[0].body["docs"]) == 2  # top_k × 1 candidates
    assert calls[0].body["query"] == "annual leave days"
    assert reranked["metrics"]["rerank_candidates"] == 2
    # A request overrides the profile; null turns the threshold off.
    more = client.post(url, {"query": "annual leave days", "top_k": 3, "score_threshold": None},
                       format="json").json()  # fmt: skip
    assert len(more["items"]) == 3
    assert [i["score"] for i in more["items"]] == sorted(
        (i["score"] for i in more["items"]), reverse=True
    )
    dify.fail_next(5, status=503, route=RERANK)
    down = client.post(url, {"query": "annual leave days"}, format="json")
    assert down.status_code == 503 and down.json()["code"] == "rerank_unavailable"


# --- the registry ------------------------------------------------------------------------------


def test_vector_space_ids_are_served_only_for_their_space_and_runtime(dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    client.post(f"{SPACES}/{space.id}/profile-validation")
    vector_space = profile(space).vector_space_id
    with pytest.raises(UnknownEmbeddingModel, match="served only for its space"):
        get_embedding_model(vector_space)
    other = new_space(principal, "Other")
    with pytest.raises(UnknownEmbeddingModel, match="not the embedding profile"):
        get_embedding_model(vector_space, space=other)
    assert get_embedding_model(vector_space, space=space).dimension == 48


def test_a_dify_space_on_a_local_server_fails_closed(dify, client, principal, settings):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    admit_document(space, filename="leave.md", data=LEAVE, enqueue=False)
    compile_all()
    settings.KNOWLEDGE_MODEL_RUNTIME = "local"
    with pytest.raises(UnknownEmbeddingModel, match="KNOWLEDGE_MODEL_RUNTIME='local'"):
        get_embedding_model(profile(space).vector_space_id, space=space)
    answer = client.post(f"{SPACES}/{space.id}/retrieval-tests", {"query": "x"}, format="json")
    assert answer.status_code == 503 and answer.json()["code"] == "embedding_model_unavailable"
    failed = client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]
    assert failed["failure"]["code"] == "capability_unavailable"


# --- capability tokens and the command line -------------------------------------------------------


def test_profile_routes_take_their_own_capability_actions(settings, principal):
    from knowledgefs.testing import capability as cap

    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    space = new_space(principal)
    resource = cap.space_resource(str(space.id))
    url = f"{SPACES}/{space.id}"
    body = local_selection().as_dict()
    for action, method, path, data, expected in (
        ("knowledge_spaces.update_embedding_profile", "put", "/embedding-profile", body, 200),
        ("knowledge_spaces.update_retrieval_profile", "put", "/retrieval-profile", {}, 200),
        ("knowledge_spaces.validate_profiles", "post", "/profile-validation", None, 200),
        ("knowledge_spaces.update", "put", "/embedding-profile", body, 403),
    ):
        api = APIClient()
        token = cap.token(action=action, resource=resource, caller_kind="interactive")
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        answer = getattr(api, method)(url + path, data, format="json")
        assert answer.status_code == expected, (action, answer.content)
    agent = APIClient()
    token = cap.token(
        action="knowledge_spaces.update_retrieval_profile", resource=resource, caller_kind="agent"
    )
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    refused = agent.put(url + "/retrieval-profile", {}, format="json")
    assert refused.json()["code"] == "caller_kind_not_permitted"


def test_a_space_bound_key_cannot_touch_another_spaces_profiles(client, principal, tenant):
    mine, theirs = new_space(principal, "Mine"), new_space(principal, "Theirs")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant, spaces=[mine])[1]}")
    assert put(api, mine, "retrieval", {"top_k": 3}).status_code == 200
    assert put(api, theirs, "retrieval", {"top_k": 3}).status_code == 404
    assert api.post(f"{SPACES}/{theirs.id}/profile-validation").status_code == 404
    assert profile(theirs).retrieval_top_k == 10


def test_kfs_space_profile_commands(dify, principal):
    space = new_space(principal, "Handbook")
    tenant = principal.tenant_id
    with pytest.raises(CommandError, match="invalid_model_selection"):
        kfs("space", "set-embedding-profile", space.slug, "--tenant", tenant,
            "--plugin-id", "openai", "--provider", "openai", "--model", "m")  # fmt: skip
    out = json.loads(
        kfs(
            "space",
            "set-embedding-profile",
            space.slug,
            "--tenant",
            tenant,
            "--plugin-id",
            OPENAI["plugin_id"],
            "--provider",
            OPENAI["provider"],
            "--model",
            OPENAI["model"],
            "--json",
        )  # fmt: skip
    )
    assert out["readiness"]["state"] == "pending-validation"
    text = kfs("space", "set-retrieval-profile", space.slug, "--tenant", tenant, "--top-k", "5",
               "--score-threshold", "0.3", "--rerank-model", *RERANKER.values())  # fmt: skip
    assert "pending-validation" in text and '"top_k": 5' in text
    with pytest.raises(CommandError, match="score_threshold_requires_rerank"):
        kfs("space", "set-retrieval-profile", space.slug, "--tenant", tenant,
            "--score-threshold", "0.3")  # fmt: skip
    ready = json.loads(kfs("space", "validate", space.slug, "--tenant", tenant, "--json"))
    assert ready["readiness"]["state"] == "ready"
    assert ready["embedding_profile"]["dimension"] == 48
    assert ready["retrieval_profile"]["rerank"] == {"enabled": True, "model": RERANKER}
    listed = json.loads(kfs("space", "list", "--tenant", tenant, "--json"))["items"]
    assert [(s["slug"], s["readiness"]) for s in listed] == [("handbook", "ready")]
    dify.fail_next(5, status=401, route=TEXT_EMBEDDING)
    text = kfs("space", "validate", space.slug, "--tenant", tenant)
    assert "validation-failed (credential_invalid on embedding" in text


def test_admin_shows_readiness_and_validates(admin_client, dify, client, principal):
    space = new_space(principal)
    put(client, space, "embedding", OPENAI)
    listing = admin_client.get("/admin/spaces/knowledgespace/?readiness=pending-validation")
    assert listing.status_code == 200 and space.slug in listing.content.decode()
    assert "pending-validation" in listing.content.decode()
    page = admin_client.get(f"/admin/spaces/knowledgespace/{space.id}/change/")
    assert page.status_code == 200 and "text-embedding-3-small" in page.content.decode()
    done = admin_client.post(
        "/admin/spaces/knowledgespace/",
        {"action": "validate_profiles", "_selected_action": [str(space.id)]},
        follow=True,
    )
    assert done.status_code == 200 and f"{space.slug}: ready" in done.content.decode().lower()
    assert profile(space).state == "ready"


# --- the migration -------------------------------------------------------------------------------

BEFORE_PROFILES = [("spaces", "0004_remove_scoped_and_space_memberships")]
WITH_PROFILES = [("spaces", "0005_space_profiles")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_spaces_their_local_profile_and_goes_back():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE_PROFILES)
        # the ingestion and retrieval migrations still applied (later ones that depend on the
        # profiles were unapplied with them)
        applied = MigrationExecutor(connection).loader.applied_migrations
        others = [
            max((n for n in applied if n[0] == app), key=lambda n: n[1])
            for app in ("retrieval", "ingestion")
        ]
        old = executor.loader.project_state(BEFORE_PROFILES + others).apps
        Space = old.get_model("spaces", "KnowledgeSpace")
        Version = old.get_model("retrieval", "IndexVersion")
        OldDocument = old.get_model("ingestion", "Document")
        empty = Space.objects.create(tenant_id="t", name="Empty", slug="empty")
        chosen = Space.objects.create(
            tenant_id="t", name="Chosen", slug="chosen", embedding_model_id=MODEL_A,
            embedding_dimension=8,
        )  # fmt: skip
        Version.objects.create(
            space=chosen, number=1, model_id=MODEL_A, dimension=8, state="active"
        )
        used = Space.objects.create(tenant_id="t", name="Used", slug="used")
        Version.objects.create(
            space=used, number=1, model_id=MINILM_MODEL_ID, dimension=384, state="retired"
        )
        Version.objects.create(space=used, number=2, model_id=MODEL_B, dimension=4, state="active")
        document = OldDocument.objects.create(
            tenant_id="t", space=used, filename="a.md", mime_type="text/markdown",
            size_bytes=1, sha256="0" * 64, storage_key="k/a",
        )  # fmt: skip

        executor = MigrationExecutor(connection)
        executor.migrate(WITH_PROFILES)
        new = executor.loader.project_state(WITH_PROFILES).apps
        rows = {p.space_id: p for p in new.get_model("spaces", "SpaceProfile").objects.all()}
        assert set(rows) == {empty.id, chosen.id, used.id}
        # Spaces that existed before profiles were made on MiniLM, the default then: they keep
        # it (new spaces get bge-small-en-v1.5).
        expected = {
            empty.id: (MINILM_MODEL_ID, None, None),
            chosen.id: (MODEL_A, 8, None),
            used.id: (MODEL_B, 4, document.created_at),
        }
        for space_id, (model, dimension, frozen_at) in expected.items():
            row = rows[space_id]
            assert (row.embedding_plugin_id, row.embedding_provider) == ("local", "local")
            assert (row.embedding_model, row.embedding_dimension) == (model, dimension)
            assert row.embedding_frozen_at == frozen_at
            assert row.state == "ready" and row.retrieval_top_k == 10
            selection = local_selection(model)
            assert row.vector_space_id == vector_space_id(selection, local_identity(model))

        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE_PROFILES)
        assert "spaces_spaceprofile" not in connection.introspection.table_names()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
