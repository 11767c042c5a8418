"""Image capability from the frozen profiles: the image probes of the preflight, the legacy
snapshot rule (catalog drift or outage fails closed to text), the capabilities shown on the
space, and the simulated Dify's multimodal route (limits and an image embedder under which the
same picture is found again)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, ImageDraw

from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_images import MAX_DOCUMENT_BYTES, image_vector
from knowledgefs.testing.dify_server import (
    MODEL_CATALOG,
    MULTIMODAL_EMBEDDING,
    TEST_INNER_KEY,
    TEXT_EMBEDDING,
)
from spaces import capabilities
from spaces.capabilities import PROBE_PNG
from spaces.models import SpaceProfile
from spaces.services import create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

CLIP = {"plugin_id": "langgenius/jina", "provider": "jina", "model": "jina-clip-v2"}
OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
VISION_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1"}
TEXT_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
SPACES = "/v1/knowledge-spaces"


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 64
    capabilities.set_catalog_lookup(None)
    yield dify_server
    capabilities.set_catalog_lookup(None)


def validated(client, principal, embedding, reasoning=None) -> dict:
    space = create_space(principal, name="Pictures")
    assert (
        client.put(f"{SPACES}/{space.id}/embedding-profile", embedding, format="json").status_code
        == 200
    )
    if reasoning is not None:
        body = {"reasoning_model": reasoning}
        assert (
            client.put(f"{SPACES}/{space.id}/retrieval-profile", body, format="json").status_code
            == 200
        )
    body = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert body["readiness"]["state"] == "ready", body["readiness"]
    return client.get(f"{SPACES}/{space.id}").json()


def picture(seed: int, size=(320, 240), fmt="PNG") -> bytes:
    """A figure: shapes placed by ``seed`` on white."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y = rng.integers(0, size[0] - 60), rng.integers(0, size[1] - 60)
        w, h = rng.integers(20, 60, size=2)
        draw.rectangle(
            [int(x), int(y), int(x + w), int(y + h)], fill=tuple(rng.integers(0, 200, 3))
        )
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


# --- the preflight's image probes -----------------------------------------------------------------


def test_a_multimodal_embedding_profile_declares_image_input_after_three_agreeing_probes(
    dify, client, principal
):
    body = validated(client, principal, CLIP)
    caps = body["capabilities"]
    assert caps["embedding"] == {
        "input_modalities": ["text", "image"],
        "image_input": True,
        "source": "validated-probes",
        "reason": None,
    }
    assert (
        caps["visual_projections"] is True and caps["image_only_fast_query"] == "visual-retrieval"
    )
    images = dify.calls(MULTIMODAL_EMBEDDING)
    assert [c.body["input_type"] for c in images] == ["document", "query"]
    for call in images:
        (document,) = call.body["documents"]
        assert base64.b64decode(document["content"]) == PROBE_PNG
        assert Image.open(io.BytesIO(PROBE_PNG)).size == (1, 1)
    # the text probe of the identity comparison, beside the two dimension probes
    assert len(dify.calls(TEXT_EMBEDDING)) == 3
    frozen = SpaceProfile.objects.get(space_id=body["id"]).capabilities["embedding"]
    assert frozen["probe_model"] == "jina-clip-v2"
    assert frozen["catalog_digest"].startswith("sha256:")


def test_image_probes_answered_by_another_model_leave_the_profile_text_only(
    dify, client, principal
):
    dify.multimodal_identity = "some-other-clip"
    caps = validated(client, principal, CLIP)["capabilities"]
    assert caps["embedding"]["input_modalities"] == ["text"]
    assert caps["embedding"]["reason"] == "image-probe-mismatch"
    assert caps["image_only_fast_query"] == "rejected"


def test_image_probes_of_another_dimension_leave_the_profile_text_only(dify, client, principal):
    dify.add_fault("dimension", MULTIMODAL_EMBEDDING, dimension=32, times=None)
    caps = validated(client, principal, CLIP)["capabilities"]
    assert caps["embedding"]["image_input"] is False
    assert caps["embedding"]["reason"] == "image-probe-mismatch"


def test_a_failing_image_probe_fails_closed_to_text_and_the_text_profile_stays_valid(
    dify, client, principal
):
    dify.add_fault("status", MULTIMODAL_EMBEDDING, status=400, times=None)
    caps = validated(client, principal, CLIP)["capabilities"]
    assert caps["embedding"]["image_input"] is False
    assert caps["embedding"]["reason"].startswith("image-probe-failed:")


def test_a_text_embedding_model_is_never_probed_with_images(dify, client, principal):
    caps = validated(client, principal, OPENAI, reasoning=TEXT_LLM)["capabilities"]
    assert dify.count(MULTIMODAL_EMBEDDING) == 0
    assert caps["embedding"]["reason"] == "embedding-model-text-only"
    assert caps["reasoning"]["reason"] == "reasoning-model-text-only"
    assert caps["image_only_fast_query"] == "rejected"
    assert caps["image_understanding"] is False and caps["multimodal_answers"] is False


def test_a_vision_reasoning_model_declares_image_understanding(dify, client, principal):
    caps = validated(client, principal, OPENAI, reasoning=VISION_LLM)["capabilities"]
    assert caps["reasoning"]["input_modalities"] == ["text", "image"]
    assert caps["image_understanding"] is True and caps["multimodal_answers"] is True
    assert caps["image_only_fast_query"] == "vision-expansion"


def test_the_embedded_default_is_text_only(client):
    body = client.post(SPACES, {"name": "Local"}, format="json").json()
    shown = client.get(f"{SPACES}/{body['id']}").json()["capabilities"]
    assert shown["embedding"] == {
        "input_modalities": ["text"],
        "image_input": False,
        "source": "embedded-model",
        "reason": "embedding-model-text-only",
    }
    assert shown["image_only_fast_query"] == "rejected"


# --- legacy snapshots -----------------------------------------------------------------------------


def _make_legacy(space_id) -> None:
    """The snapshot as a release before image input recorded it."""
    row = SpaceProfile.objects.get(space_id=space_id)
    embedding = dict(row.capabilities["embedding"])
    for name in ("input_modalities", "image_reason", "probe_model", "catalog_digest"):
        embedding.pop(name, None)
    SpaceProfile.objects.filter(space_id=space_id).update(
        capabilities={**row.capabilities, "embedding": embedding}
    )


def test_a_legacy_snapshot_is_image_capable_only_while_the_catalog_matches(dify, client, principal):
    space_id = validated(client, principal, CLIP)["id"]
    _make_legacy(space_id)
    capabilities.set_catalog_lookup(None)
    shown = client.get(f"{SPACES}/{space_id}").json()["capabilities"]["embedding"]
    assert shown["image_input"] is True and shown["source"] == "legacy-catalog-match"

    # drift: the same model name now resolves to another install
    dify.catalog_overrides["jina-clip-v2"] = {"identity": "langgenius/jina:2.0.0@sha256:def"}
    capabilities.set_catalog_lookup(None)
    shown = client.get(f"{SPACES}/{space_id}").json()["capabilities"]["embedding"]
    assert (shown["image_input"], shown["reason"]) == (False, "catalog-drift")

    # drift of a declared capability only (same install identity)
    dify.catalog_overrides["jina-clip-v2"] = {"capabilities": {"features": ["vision", "x"]}}
    capabilities.set_catalog_lookup(None)
    shown = client.get(f"{SPACES}/{space_id}").json()["capabilities"]["embedding"]
    assert (shown["image_input"], shown["reason"]) == (False, "catalog-drift")

    # outage
    dify.catalog_overrides.clear()
    capabilities.set_catalog_lookup(None)
    dify.add_fault("status", MODEL_CATALOG, status=503, times=None)
    shown = client.get(f"{SPACES}/{space_id}").json()["capabilities"]["embedding"]
    assert (shown["image_input"], shown["reason"]) == (False, "catalog-unavailable")


# --- the simulated route --------------------------------------------------------------------------


def test_the_image_embedder_finds_the_same_picture_again():
    figures = [picture(seed) for seed in range(12)]
    matrix = np.array([image_vector(f, 64) for f in figures])
    again = Image.open(io.BytesIO(figures[7])).convert("RGB").resize((640, 480))
    out = io.BytesIO()
    again.save(out, "JPEG", quality=80)
    query = np.array(image_vector(out.getvalue(), 64))
    scores = matrix @ query
    assert int(np.argmax(scores)) == 7
    assert scores[7] > 0.95 and sorted(scores)[-2] < scores[7] - 0.1


def test_the_multimodal_route_enforces_its_limits(dify):
    from knowledgefs.dify.errors import ModelRuntimeError
    from knowledgefs.runtime import model_runtime

    runtime = model_runtime()
    encoded = {"content": base64.b64encode(PROBE_PNG).decode(), "content_type": "image"}
    common = {
        "tenant_id": "t",
        "user_id": "knowledge-fs",
        "provider": "langgenius/jina/jina",
        "model": "jina-clip-v2",
        "model_type": "text-embedding",
        "input_type": "document",
    }
    with pytest.raises(ModelRuntimeError) as nine:
        runtime._unary(MULTIMODAL_EMBEDDING, {**common, "documents": [encoded] * 9})
    assert nine.value.status == 413
    big = {"content": base64.b64encode(bytes(MAX_DOCUMENT_BYTES + 1)).decode()}
    with pytest.raises(ModelRuntimeError) as large:
        runtime._unary(MULTIMODAL_EMBEDDING, {**common, "documents": [big]})
    assert large.value.status == 413
    assert dify.calls(MULTIMODAL_EMBEDDING)[-1].body["documents"][0]["content"].startswith("<")
