"""Image understanding: document images described in compilation by a vision reasoning model
(caption, OCR text, summary as strict JSON), indexed as text beside the image and cited to it;
a text-only reasoning model never receives a byte; malformed answers, Dify errors and timeouts
fail only that image with a recorded reason; the byte and concurrency bounds; retries reuse
what was described; a cancel stops before the next read."""

from __future__ import annotations

import json

import pytest

from ingestion.enrichment import (
    IMAGE_CHUNK_BASE,
    EnrichmentCanceled,
    MalformedDescription,
    describe_images,
    parse_description,
)
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact
from ingestion.projection import projector
from ingestion.tests.test_visual_projections import (
    OPENAI,
    SPACES,
    figures_pdf,
    make_space,
    picture,
    pictures_docx,
    png,
)
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all, upload
from spaces import capabilities

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

VISION_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1"}
TEXT_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
LIGHTHOUSE = {
    "caption": "A lighthouse on a rocky cliff at dusk",
    "ocr_text": "KEEP OFF THE ROCKS",
    "summary": "A striped lighthouse shines over a stormy harbour.",
}
ZEBRA = {
    "caption": "A zebra crossing beside a bakery",
    "ocr_text": "",
    "summary": "Pedestrians wait at a zebra crossing in front of a bakery window.",
}


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = 1
    dify_server.dimension = 64
    capabilities.set_catalog_lookup(None)
    return dify_server


def reasoning_space(client, principal, reasoning=VISION_LLM, embedding=OPENAI):
    space = make_space(client, principal, embedding)
    body = {"reasoning_model": reasoning}
    response = client.put(f"{SPACES}/{space.id}/retrieval-profile", body, format="json")
    assert response.status_code == 200, response.content
    validated = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert validated["readiness"]["state"] == "ready", validated
    return space


def published(space, filename) -> Document:
    document = Document.objects.get(space=space, filename=filename)
    assert document.state == "published", document.error_message
    return document


def understanding(document) -> dict:
    return ParseArtifact.objects.get(job_id=document.active_generation).image_understanding


def image_nodes(document):
    return list(
        KnowledgeNode.objects.filter(
            document=document, generation=document.active_generation, kind="image"
        ).order_by("chunk_index")
    )


def ask(client, space, query):
    response = client.post(
        f"{SPACES}/{space.id}/retrieval-tests", {"query": query, "top_k": 3}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_text_query_matching_only_a_caption_finds_the_figure_page_cited_to_its_image(
    dify, client, principal
):
    dify.image_captions = [(png(picture(11)), LIGHTHOUSE), (png(picture(12)), ZEBRA)]
    space = reasoning_space(client, principal)
    upload(client, space, "figures.pdf", figures_pdf([11, 12]))
    compile_all()
    document = published(space, "figures.pdf")
    assert understanding(document) == {
        "described": 2,
        "reused": 0,
        "failed": {},
        "skipped_images": {},
    }
    assert dify.image_descriptions == 2 and dify.llm_images_received == 2
    nodes = image_nodes(document)
    assert [(n.page_number, n.metadata["description"]["caption"]) for n in nodes] == [
        (1, LIGHTHOUSE["caption"]),
        (2, ZEBRA["caption"]),
    ]
    # the document's own text says nothing of zebras or bakeries
    text = client.get(f"{SPACES}/{space.id}/documents/{document.id}/text").json()
    assert "zebra" not in json.dumps(text).lower()
    body = ask(client, space, "zebra crossing bakery")
    top = body["items"][0]
    assert (top["citation"]["filename"], top["citation"]["page_number"]) == ("figures.pdf", 2)
    image = top["citation"]["image"]
    assets = ParseArtifact.objects.get(job_id=document.active_generation).assets
    assert assets[image["asset_index"]]["kind"] == "page_image"
    assert assets[image["asset_index"]]["page_number"] == 2
    assert image["source"] == "description" and image["page_number"] == 2
    served = client.get(image["asset_url"])
    assert served.status_code == 200 and served["Content-Type"] == "image/png"
    # the OCR text is searchable too, and the node counts towards the document's nodes
    assert ask(client, space, "keep off the rocks")["items"][0]["citation"]["page_number"] == 1
    assert (
        document.node_count
        == KnowledgeNode.objects.filter(
            document=document, generation=document.active_generation
        ).count()
    )


def test_without_a_registered_picture_the_description_is_deterministic(dify, client, principal):
    space = reasoning_space(client, principal)
    upload(client, space, "pictures.docx", pictures_docx([21]))
    compile_all()
    (node,) = image_nodes(published(space, "pictures.docx"))
    assert node.text.startswith("A picture of 480 by 360 pixels, mostly ")
    assert node.page_number is None and node.chunk_index == IMAGE_CHUNK_BASE + 0


def test_a_text_only_reasoning_model_never_receives_bytes(dify, client, principal):
    space = reasoning_space(client, principal, reasoning=TEXT_LLM)
    dify.reset_observations()
    upload(client, space, "pictures.docx", pictures_docx([21, 22]))
    compile_all()
    document = published(space, "pictures.docx")
    assert understanding(document)["skipped"] == "reasoning-model-text-only"
    shown = client.get(f"{SPACES}/{space.id}/documents/{document.id}").json()
    assert shown["image_understanding"] == {
        "skipped": "reasoning-model-text-only",
        "detail": "reasoning-model-text-only",
    }
    assert image_nodes(document) == []
    assert dify.count(LLM) == 0 and dify.llm_images_received == 0
    # no reasoning model at all: said as such
    plain = make_space(client, principal, OPENAI)
    upload(client, plain, "pictures.docx", pictures_docx([23]))
    compile_all()
    assert understanding(published(plain, "pictures.docx"))["skipped"] == "no-reasoning-model"
    assert dify.count(LLM) == 0


def test_a_malformed_answer_fails_that_image_with_its_reason(dify, client, principal, settings):
    settings.KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY = 1  # the first image gets the fault
    space = reasoning_space(client, principal)
    dify.add_fault("malformed", LLM, times=1)
    upload(client, space, "pictures.docx", pictures_docx([21, 22]))
    compile_all()
    document = published(space, "pictures.docx")
    report = understanding(document)
    assert report["described"] == 1
    assert list(report["failed"]) == ["0"]
    assert report["failed"]["0"].startswith("malformed-output: not JSON")
    (node,) = image_nodes(document)
    assert node.metadata["image"]["asset_index"] == 1
    assert not KnowledgeNode.objects.filter(text__contains="Here is the description").exists()


def test_dify_errors_and_timeouts_fail_the_images_and_the_text_is_published(
    dify, client, principal, settings
):
    space = reasoning_space(client, principal)
    dify.fail_next(50, status=503, route=LLM)
    upload(client, space, "errors.docx", pictures_docx([21]))
    compile_all()
    report = understanding(published(space, "errors.docx"))
    assert report["described"] == 0
    assert report["failed"]["0"].startswith("model-error: MODEL_RUNTIME_")
    dify.clear_faults()
    settings.KNOWLEDGE_MULTIMODAL_ENRICHMENT_TIMEOUT_MS = 1000
    dify.delay(4, route=LLM, times=None)
    upload(client, space, "slow.docx", pictures_docx([22]))
    compile_all()
    document = published(space, "slow.docx")
    assert understanding(document)["failed"] == {"0": "timeout"}
    assert image_nodes(document) == []
    dify.clear_faults()


def test_images_over_the_byte_limit_are_skipped_before_and_while_reading(
    dify, client, principal, settings
):
    space = reasoning_space(client, principal)
    settings.KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_IMAGE_BYTES = 1024
    dify.reset_observations()
    upload(client, space, "pictures.docx", pictures_docx([21]))
    compile_all()
    document = published(space, "pictures.docx")
    assert understanding(document)["skipped_images"] == {"0": "too-large"}
    assert dify.count(LLM) == 0
    # a recorded size under the limit does not let a larger body through: the read stops there
    artifact = ParseArtifact.objects.get(job_id=document.active_generation)
    artifact.assets = [{**a, "bytes": 100} for a in artifact.assets]
    artifact.save(update_fields=["assets"])
    job = CompilationJob.objects.get(id=document.active_generation)
    report = describe_images(job)
    assert report.failed == {0: "too-large"} and dify.count(LLM) == 0


def test_calls_stay_within_the_concurrency_limit(dify, client, principal, settings):
    settings.KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY = 2
    space = reasoning_space(client, principal)
    dify.delay(0.4, route=LLM, times=None)
    upload(client, space, "five.docx", pictures_docx([31, 32, 33, 34, 35]))
    compile_all()
    dify.clear_faults()
    assert understanding(published(space, "five.docx"))["described"] == 5
    assert dify.peak_in_flight(LLM) == 2


def test_a_retry_reuses_the_descriptions_and_a_cancel_stops_before_reading(dify, client, principal):
    space = reasoning_space(client, principal)
    upload(client, space, "pictures.docx", pictures_docx([21, 22]))
    compile_all()
    document = published(space, "pictures.docx")
    before = [(n.id, n.text) for n in image_nodes(document)]
    job = CompilationJob.objects.get(id=document.active_generation)
    calls = dify.count(LLM)
    report = describe_images(job)
    assert (report.described, report.reused, report.nodes) == (0, 2, 2)
    assert dify.count(LLM) == calls
    assert [(n.id, n.text) for n in image_nodes(document)] == before
    # one description removed (as a generation drop does): only that image is asked again
    projector().delete([before[1][0]])
    KnowledgeNode.objects.filter(id=before[1][0]).delete()
    report = describe_images(job)
    assert (report.described, report.reused) == (1, 1) and dify.count(LLM) == calls + 1
    assert [(n.id, n.text) for n in image_nodes(document)] == before
    projector().delete([before[0][0]])
    KnowledgeNode.objects.filter(id=before[0][0]).delete()
    with pytest.raises(EnrichmentCanceled):
        describe_images(job, cancelled=lambda: True)
    assert dify.count(LLM) == calls + 1


def test_a_cancel_while_images_are_described_stops_the_rest_and_writes_nothing(
    dify, client, principal, settings
):
    settings.KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY = 1
    space = reasoning_space(client, principal, reasoning=TEXT_LLM)  # compiled without them
    upload(client, space, "three.docx", pictures_docx([41, 42, 43]))
    compile_all()
    document = published(space, "three.docx")
    job = CompilationJob.objects.get(id=document.active_generation)
    body = {"reasoning_model": VISION_LLM}
    client.put(f"{SPACES}/{space.id}/retrieval-profile", body, format="json")
    assert client.post(f"{SPACES}/{space.id}/profile-validation").status_code == 200
    dify.reset_observations()
    dify.delay(0.6, route=LLM, times=None)
    try:
        with pytest.raises(EnrichmentCanceled):
            describe_images(job, cancelled=lambda: dify.image_descriptions >= 1)
    finally:
        dify.clear_faults()
    assert dify.count(LLM) < 3  # the images not yet read were never sent
    assert image_nodes(document) == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ('```json\n{"caption": "a", "ocr_text": "", "summary": ""}\n```', "not JSON"),
        ('{"caption": "a", "ocr_text": "", "summary": ' + "1" * 5000 + "}", "not JSON"),
        ('["caption"]', "a JSON list, not an object"),
        ('{"caption": "a", "ocr_text": ""}', "members: missing summary"),
        ('{"caption": "a", "ocr_text": "", "summary": "", "x": 1}', "members: unexpected x"),
        ('{"caption": "a", "ocr_text": 3, "summary": ""}', "ocr_text is a int, not a string"),
        ('{"caption": "  ", "ocr_text": "", "summary": ""}', "caption is empty"),
        (
            json.dumps({"caption": "a" * 1001, "ocr_text": "", "summary": ""}),
            "caption holds 1001 characters; at most 1000",
        ),
    ],  # fmt: skip
)
def test_the_answer_shape_is_checked_strictly(answer, reason):
    with pytest.raises(MalformedDescription, match=reason):
        parse_description(answer)


def test_a_well_formed_answer_is_cleaned_of_control_characters():
    answer = ' {"caption": "A chart\\u0007", "ocr_text": "Q1\\n  Q2", "summary": "Up."} '
    assert parse_description(answer) == {"caption": "A chart", "ocr_text": "Q1 Q2",
                                         "summary": "Up."}  # fmt: skip
