"""The local embedding models: bge-small-en-v1.5 int8 by default, MiniLM selectable, files checked.

Real parts only: the installed ONNX files, the real registry, SQLite, the compiler, the index
builds and the ``/ready`` probe. A damaged model file is simulated by pointing the model's file
locator at a copy in a temporary folder (the installed files are never touched).
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs import health
from knowledgefs.runtime import (
    DEFAULT_MODEL_ID,
    MINILM_MODEL_ID,
    UnknownEmbeddingModel,
    default_model_id,
    get_embedding_model,
    local_embedding,
)
from knowledgefs.runtime.local_embedding import (
    BGE_QUERY_PREFIX,
    BGE_SMALL,
    LOCAL_MODELS,
    MINILM,
    LocalOnnxEmbedding,
    ModelFileMismatch,
)
from knowledgefs.runtime.model_files import ModelFiles, file_sha256
from knowledgefs.testing.fixtures import compile_all
from retrieval import index_builds
from retrieval.models import IndexVersion
from retrieval.modes import retrieve
from spaces.services import create_space

pytestmark = [pytest.mark.timeout(600)]

SPACES = "/v1/knowledge-spaces"
DOC = (
    b"# Tides\n\nThe harbour crane lifts containers at high tide. Spring tides come after the new "
    b"moon and raise the water well above the quay.\n\n# Bread\n\nSourdough rises slowly because "
    b"wild yeast ferments the dough overnight."
)


@pytest.fixture(autouse=True)
def fresh_probes():
    health.reset()
    yield
    health.reset()


def test_the_installed_files_have_the_recorded_sha256():
    for model in (BGE_SMALL, MINILM):
        onnx, tokenizer = model.files.verified()
        assert file_sha256(onnx) == model.files.sha256 and tokenizer.is_file()
    assert BGE_SMALL.files.sha256 == (
        "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743"
    )


def test_bge_small_is_the_default_with_cls_pooling_a_query_prefix_and_a_512_window(settings):
    assert default_model_id() == DEFAULT_MODEL_ID == BGE_SMALL.model_id
    model = get_embedding_model()
    assert (model.model_id, model.dimension, model.max_input_tokens) == (DEFAULT_MODEL_ID, 384, 512)
    passages = ["Paris is the capital of France.", "Bananas are a yellow fruit."]
    vectors = model.embed_documents(passages)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    query = "what is the capital of france"
    scores = vectors @ model.embed_query(query)
    assert scores[0] > scores[1] + 0.2, scores
    # Queries carry the instruction prefix, passages do not.
    assert np.allclose(
        model.embed_query(query), model.embed_documents([BGE_QUERY_PREFIX + query])[0]
    )
    assert not np.allclose(model.embed_query(query), model.embed_documents([query])[0])
    # Truncation at 512 word pieces is set explicitly (the file sets none; longer input failed).
    long_text = "harbour cranes lift containers at the quay " * 400
    assert model.count_tokens(long_text) > 2000
    assert model.token_counts([long_text]) == [512]
    assert model.embed_documents([long_text]).shape == (1, 384)
    # MiniLM stays registered, mean-pooled, with its 256 window and no prefix.
    minilm = get_embedding_model(MINILM_MODEL_ID)
    assert (minilm.max_input_tokens, minilm.spec.pooling, minilm.spec.query_prefix) == (
        256,
        "mean",
        "",
    )
    settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = MINILM_MODEL_ID
    assert get_embedding_model() is minilm
    settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = "local/no-such-model"
    with pytest.raises(UnknownEmbeddingModel, match="no-such-model"):
        default_model_id()


@pytest.fixture
def damaged_bge(tmp_path, monkeypatch):
    """bge-small's files, copied, with one byte of model.onnx changed."""
    onnx, tokenizer = BGE_SMALL.files.locate()
    copy = tmp_path / "bge_small_en"
    copy.mkdir()
    shutil.copy(tokenizer, copy / "tokenizer.json")
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(data))
    files = ModelFiles(
        BGE_SMALL.files.name,
        lambda: (copy / "model.onnx", copy / "tokenizer.json"),
        BGE_SMALL.files.sha256,
    )
    damaged = dataclasses.replace(BGE_SMALL, files=files)
    monkeypatch.setitem(LOCAL_MODELS, BGE_SMALL.model_id, damaged)
    return damaged, copy / "model.onnx"


def test_a_model_file_whose_sha256_differs_is_refused_at_start_up_naming_the_file(db, damaged_bge):
    damaged, path = damaged_bge
    # The model is never loaded from it.
    with pytest.raises(ModelFileMismatch) as refused:
        LocalOnnxEmbedding(model=damaged)
    assert refused.value.path == path and str(path) in str(refused.value)
    assert refused.value.expected == BGE_SMALL.files.sha256 != refused.value.actual
    # Start-up (every management command: qcluster, migrate, runserver) refuses, naming it.
    with pytest.raises(SystemCheckError) as check:
        call_command("check")
    assert "knowledgefs.E201" in str(check.value) and str(path) in str(check.value)
    # /ready fails model_runtime with the file's name.
    ready = APIClient().get("/ready")
    assert ready.status_code == 503, ready.json()
    assert ready.json()["failing"] == ["model_runtime"]
    assert str(path) in ready.json()["checks"]["model_runtime"]["detail"]
    assert "sha256" in ready.json()["checks"]["model_runtime"]["detail"]


def test_the_installed_files_pass_the_start_up_check(db):
    call_command("check")
    ready = APIClient().get("/ready")
    assert ready.status_code == 200, ready.json()
    assert local_embedding.LOCAL_MODELS[DEFAULT_MODEL_ID] is BGE_SMALL


def _admit(space, data: bytes, name: str) -> None:
    admit_document(space, filename=name, data=data, enqueue=False)
    compile_all()


def test_existing_spaces_keep_minilm_new_spaces_get_bge_and_a_change_builds_a_new_version(
    db, principal, client, settings
):
    # A space created while MiniLM was the default (what every space before bge-small has).
    settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = MINILM_MODEL_ID
    old = create_space(principal, name="Before bge")
    _admit(old, DOC, "tides.md")
    settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = ""
    new = create_space(principal, name="After bge")
    _admit(new, DOC, "tides.md")
    _admit(old, b"Wild yeast needs warmth; a cold kitchen slows the dough.", "yeast.txt")
    for space, model_id in ((old, MINILM_MODEL_ID), (new, DEFAULT_MODEL_ID)):
        described = client.get(f"{SPACES}/{space.id}").json()
        assert described["embedding_profile"]["model"] == model_id
        assert described["index"]["active"]["model_id"] == model_id
        assert IndexVersion.objects.filter(space=space).count() == 1
    # Changing the old space's model goes through a new index version (blue-green).
    changed = client.patch(f"{SPACES}/{old.id}", {"embedding_model_id": DEFAULT_MODEL_ID})
    assert changed.status_code in (200, 202), changed.content
    building = IndexVersion.objects.get(space=old, state="building")
    assert building.model_id == DEFAULT_MODEL_ID
    during = retrieve(old, "when do spring tides come", top_k=3)
    assert during.metrics["index_version"] == 1
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    after = retrieve(old, "when do spring tides come", top_k=3)
    assert after.metrics["index_version"] == building.number
    assert "Spring tides" in after.items[0].text
    described = client.get(f"{SPACES}/{old.id}").json()
    assert described["embedding_profile"]["model"] == DEFAULT_MODEL_ID
    assert KnowledgeNode.objects.filter(space=old).count() >= 2


def test_an_unregistered_default_model_stops_start_up(db, settings):
    settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = "local/no-such-model"
    with pytest.raises(SystemCheckError) as check:
        call_command("check")
    assert "knowledgefs.E202" in str(check.value) and "local/no-such-model" in str(check.value)
