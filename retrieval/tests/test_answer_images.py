"""Multimodal answers: a vision reasoning model receives the query's images, then the images
cited by the evidence, within the count and byte budgets (evidence dropped first), counted on
the simulated Dify; a text-only reasoning model never receives an image byte."""

from __future__ import annotations

import pytest

from ingestion.tests.test_visual_projections import (
    CLIP,
    SPACES,
    figures_pdf,
    make_space,
    pictures_docx,
)
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.answers.images import GATE
from retrieval.tests.test_query_images import jpeg, offer
from spaces import capabilities

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
VISION_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1"}
TEXT_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 64
    capabilities.set_catalog_lookup(None)
    return dify_server


def space_with(client, principal, reasoning):
    space = make_space(client, principal, CLIP)
    body = {"reasoning_model": reasoning}
    response = client.put(f"{SPACES}/{space.id}/retrieval-profile", body, format="json")
    assert response.status_code == 200
    ready = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert ready["readiness"]["state"] == "ready"
    upload(client, space, "figures.pdf", figures_pdf([11, 12, 13]))
    upload(client, space, "pictures.docx", pictures_docx([21, 22]))
    compile_all()
    return space


def answer(client, space, reference):
    body = {"space_id": str(space.id), "query": "What does this figure show?",
            "query_images": [reference], "top_k": 5}  # fmt: skip
    response = client.post("/v1/queries", body, format="json")
    assert response.status_code == 200, response.content
    b"".join(response.streaming_content)
    return client.get(f"/v1/queries/{response['X-Query-Run-Id']}").json()


def test_a_vision_answer_receives_the_query_image_first_then_evidence_images(
    dify, client, principal
):
    space = space_with(client, principal, VISION_LLM)
    seen = []
    dify.llm_responder = lambda body: seen.append(body) or "It shows shapes [E1]."
    dify.reset_observations()
    trace = answer(client, space, offer(dify, space, "fig", jpeg(12)))
    step = next(s for s in trace["steps"] if s["name"] == "answer.images")["metadata"]
    assert step["query_images"] == 1 and step["evidence_images"] >= 1
    assert dify.llm_images_received == 1 + step["evidence_images"] <= 8
    parts = seen[-1]["prompt_messages"][-1]["content"]
    images = [p for p in parts if p["type"] == "image"]
    assert images[0]["mime_type"] == "image/jpeg"  # the query's image first
    assert all(p["mime_type"] == "image/png" for p in images[1:])  # then the stored figures
    assert GATE.active == 0


def test_over_budget_the_evidence_images_are_dropped_first(dify, client, principal, settings):
    space = space_with(client, principal, VISION_LLM)
    settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS = 2
    dify.llm_responder = lambda body: "Shapes [E1]."
    dify.reset_observations()
    trace = answer(client, space, offer(dify, space, "fig", jpeg(13)))
    step = next(s for s in trace["steps"] if s["name"] == "answer.images")["metadata"]
    assert (step["query_images"], step["evidence_images"]) == (1, 1)
    assert step["dropped"]["evidence-over-attachment-limit"] >= 1
    assert dify.llm_images_received == 2
    # a byte budget below one query image: the query image itself is left out, never split
    settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES = 1024
    settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES = 1024
    dify.reset_observations()
    trace = answer(client, space, offer(dify, space, "fig2", jpeg(13)))
    step = next(s for s in trace["steps"] if s["name"] == "answer.images")["metadata"]
    assert step["query_images"] == 0 and step["dropped"]["query-over-image-bytes"] == 1
    assert dify.llm_images_received == 0


def test_a_text_only_reasoning_model_never_receives_image_bytes(dify, client, principal):
    space = space_with(client, principal, TEXT_LLM)
    dify.llm_responder = lambda body: "Shapes [E1]."
    dify.reset_observations()
    trace = answer(client, space, offer(dify, space, "fig", jpeg(12)))
    step = next(s for s in trace["steps"] if s["name"] == "answer.images")["metadata"]
    assert step["skipped"] == "reasoning-model-text-only"
    assert dify.llm_images_received == 0
