"""Query images on retrieval tests: resolved through Dify's inner API for one run, searched in
the visual space (each image on its own, fused by rank), the limits and bad input with their
codes, text-only spaces (the clear 400, or the images ignored with the degradation recorded), a
stalled Dify image stream (deadline, degradation, no 500)."""

from __future__ import annotations

import logging

import pytest

from ingestion.models import Document
from ingestion.tests.test_visual_projections import (
    CLIP,
    OPENAI,
    figures_pdf,
    make_space,
    picture,
    pictures_docx,
    png,
)
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_images import QUERY_IMAGE
from knowledgefs.testing.dify_server import MULTIMODAL_EMBEDDING, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all, upload
from spaces import capabilities

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
MIB = 1024 * 1024
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect/></svg>'


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 64
    capabilities.set_catalog_lookup(None)
    return dify_server


@pytest.fixture
def figures(dify, client, principal):
    """A CLIP space with a three-figure PDF and a two-picture DOCX, published."""
    space = make_space(client, principal, CLIP)
    upload(client, space, "figures.pdf", figures_pdf([11, 12, 13]))
    upload(client, space, "pictures.docx", pictures_docx([21, 22]))
    compile_all()
    assert set(Document.objects.filter(space=space).values_list("state", flat=True)) == {
        "published"
    }
    return space


def offer(dify, space, upload_file_id: str, data: bytes, mime: str = "image/jpeg") -> dict:
    dify.query_images[(str(space.tenant_id), upload_file_id)] = (data, mime, None)
    return {"upload_file_id": upload_file_id}


def ask(client, space, **body):
    return client.post(f"/v1/knowledge-spaces/{space.id}/retrieval-tests", body, format="json")


def jpeg(seed: int, size=(300, 225)) -> bytes:
    return png(picture(seed).resize(size), "JPEG")


def test_an_image_of_a_figure_finds_its_page_first(dify, client, figures):
    response = ask(client, figures, query_images=[offer(dify, figures, "f-12", jpeg(12))])
    assert response.status_code == 200, response.content
    body = response.json()
    top = body["items"][0]["citation"]
    assert (top["filename"], top["page_number"]) == ("figures.pdf", 2)
    assert top["image"]["page_number"] == 2
    assert top["image"]["asset_url"].endswith(f"/assets/{top['image']['asset_index']}")
    image = client.get(top["image"]["asset_url"])
    assert image.status_code == 200 and image["Content-Type"].startswith("image/")
    (record,) = body["metrics"]["query_images"]["images"]
    assert set(record) == {"upload_file_id", "sha256", "byte_size", "mime_type"}
    assert record["mime_type"] == "image/jpeg" and body["metrics"]["degradations"] == []
    visual = next(s for s in body["stages"] if s["name"] == "visual")
    assert visual["status"] == "executed"
    assert [s["status"] for s in body["stages"] if s["name"] in ("dense", "keyword")] == [
        "skipped",
        "skipped",
    ]
    calls = dify.calls(MULTIMODAL_EMBEDDING)
    assert calls[-1].body["input_type"] == "query" and len(calls[-1].body["documents"]) == 1


def test_each_image_is_searched_on_its_own_and_the_lists_fused(dify, client, figures):
    references = [offer(dify, figures, "a", jpeg(11)), offer(dify, figures, "b", jpeg(22))]
    dify.reset_observations()
    body = ask(client, figures, query_images=references).json()
    top_two = {(i["citation"]["filename"], i["citation"]["page_number"]) for i in body["items"][:2]}
    assert top_two == {("figures.pdf", 1), ("pictures.docx", None)}
    assert [len(c.body["documents"]) for c in dify.calls(MULTIMODAL_EMBEDDING)] == [1, 1]


def test_text_and_an_image_together_keep_the_text_legs(dify, client, figures):
    reference = offer(dify, figures, "f-13", jpeg(13))
    body = ask(client, figures, query="measured shapes of series", query_images=[reference]).json()
    names = {s["name"]: s["status"] for s in body["stages"]}
    assert names["dense"] == names["keyword"] == names["visual"] == "executed"
    assert body["items"][0]["citation"]["page_number"] == 3


def test_bad_query_images_are_refused_with_their_codes(dify, client, figures, caplog):
    eleven_mib = b"\x89PNG\r\n\x1a\n" + bytes(11 * MIB)
    renamed = png(picture(1))  # a PNG stored as a .gif upload
    cases = [
        ([offer(dify, figures, "svg", SVG, "image/svg+xml")], 400, "query_image_mime_unsupported"),
        ([offer(dify, figures, "gif", renamed, "image/gif")], 400, "query_image_mime_mismatch"),
        ([{"upload_file_id": str(n)} for n in range(5)], 413, "query_image_count_exceeded"),
        ([offer(dify, figures, "big", eleven_mib, "image/png")], 413, "query_image_too_large"),
        ([{"upload_file_id": "x"}, {"upload_file_id": " x "}], 400,
         "query_image_reference_duplicate"),
        ([{"file": "x"}], 400, "query_image_reference_invalid"),
        ("x", 400, "query_image_reference_invalid"),
    ]  # fmt: skip
    for references, status, code in cases:
        response = ask(client, figures, query_images=references)
        assert (response.status_code, response.json()["code"]) == (status, code), references
    # another tenant's file: 404, and nothing about the file is logged
    dify.query_images[("tenant-z", "theirs-4711")] = (jpeg(12), "image/jpeg", None)
    with caplog.at_level(logging.DEBUG):
        response = ask(client, figures, query_images=[{"upload_file_id": "theirs-4711"}])
    assert (response.status_code, response.json()["code"]) == (404, "query_image_not_found")
    # (urllib3's own DEBUG request line shows every inner call's URL, as for all Dify routes)
    ours = [r for r in caplog.records if not r.name.startswith("urllib3")]
    assert not any("theirs-4711" in r.getMessage() for r in ours)
    # neither a query nor an image
    response = ask(client, figures, query="  ", query_images=[])
    assert (response.status_code, response.json()["code"]) == (400, "invalid_query")


def test_research_does_not_take_images_yet(dify, client, figures):
    response = ask(
        client, figures, mode="research", query_images=[offer(dify, figures, "r", jpeg(1))]
    )
    assert (response.status_code, response.json()["code"]) == (400, "query_images_mode_unsupported")


def test_a_stalled_image_stream_ends_at_its_deadline_with_the_degradation(
    dify, client, figures, settings
):
    settings.KNOWLEDGE_QUERY_IMAGE_FETCH_TIMEOUT_S = 1.5
    reference = offer(dify, figures, "slow", jpeg(12))
    dify.add_fault("stall", QUERY_IMAGE, after_bytes=100, seconds=4)
    response = ask(client, figures, query="measured shapes", query_images=[reference])
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["metrics"]["degradations"] == ["query-image-visual-leg-unavailable"]
    assert body["items"]  # the text legs answered
    dify.add_fault("stall", QUERY_IMAGE, after_bytes=100, seconds=4)
    response = ask(client, figures, query_images=[reference])
    assert response.status_code == 200
    assert response.json()["items"] == []
    assert response.json()["metrics"]["degradations"] == ["query-image-visual-leg-unavailable"]


def test_an_image_only_fast_query_on_a_text_only_space_is_the_clear_400(dify, client, principal):
    space = make_space(client, principal, OPENAI)
    upload(client, space, "pictures.docx", pictures_docx([21]))
    compile_all()
    dify.reset_observations()
    response = ask(client, space, query_images=[offer(dify, space, "t", jpeg(21))])
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "query_image_requires_vision"
    assert "embedding profile is text-only (embedding-model-text-only)" in body["message"]
    assert dify.count(QUERY_IMAGE) == 0  # the bytes are never loaded
    # with text, the images are ignored and that is said
    response = ask(client, space, query="Picture of series", query_images=[{"upload_file_id": "t"}])
    assert response.status_code == 200
    assert response.json()["metrics"]["degradations"] == ["query-image-ignored-no-vision-model"]
    assert dify.count(QUERY_IMAGE) == 0


def test_an_image_only_question_on_v1_queries_is_answered_from_the_figure_page(
    dify, client, figures
):
    import json

    reference = offer(dify, figures, "q-12", jpeg(12))
    body = {"space_id": str(figures.id), "query_images": [reference], "top_k": 3}
    response = client.post("/v1/queries", body, format="json")
    assert response.status_code == 200, response.content
    text = b"".join(response.streaming_content).decode()
    assert "event: answer.done" in text
    trace = client.get(f"/v1/queries/{response['X-Query-Run-Id']}").json()
    step = next(s for s in trace["steps"] if s["name"] == "query.images")
    assert step["status"] == "ok" and step["metadata"]["visual_leg"] is True
    (image,) = step["metadata"]["images"]
    assert set(image) == {"upload_file_id", "sha256", "byte_size", "mime_type"}
    assert "q-12" in json.dumps(trace) and "base64" not in json.dumps(trace)
    # neither a query nor an image is still refused before the stream
    refused = client.post("/v1/queries", {"space_id": str(figures.id), "query": ""}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_query")


VISION_LLM = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1"}


@pytest.fixture
def described(dify, client, principal):
    """A text-only embedding profile with a vision reasoning model, one DOCX compiled."""
    from ingestion.tests.test_visual_projections import SPACES

    space = make_space(client, principal, OPENAI)
    body = {"reasoning_model": VISION_LLM}
    assert (
        client.put(f"{SPACES}/{space.id}/retrieval-profile", body, format="json").status_code == 200
    )
    assert (
        client.post(f"{SPACES}/{space.id}/profile-validation").json()["readiness"]["state"]
        == "ready"
    )
    upload(client, space, "pictures.docx", pictures_docx([21]))
    upload(client, space, "other.md", b"# Travel\n\nReceipts are due within thirty days.")
    compile_all()
    return space


def test_an_image_only_fast_query_on_a_text_only_space_uses_one_vision_expansion(
    dify, client, described
):
    import json

    def vision(body):
        content = body["prompt_messages"][-1]["content"]
        if isinstance(content, list):
            return json.dumps({"description": "Picture of series 21", "ocrText": "",
                               "keywords": ["picture", "series"]})  # fmt: skip
        return None

    dify.llm_responder = vision
    dify.reset_observations()
    response = ask(client, described, query_images=[offer(dify, described, "e", jpeg(21))])
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["items"][0]["citation"]["filename"] == "pictures.docx"
    images = body["metrics"]["query_images"]
    assert images["expansion"] is True and images["visual_leg"] is False
    assert body["metrics"]["degradations"] == []
    assert dify.llm_images_received == 1 and dify.count(MULTIMODAL_EMBEDDING) == 0


def test_a_slow_expansion_ends_at_its_timeout_with_the_degradation(
    dify, client, described, settings
):
    settings.KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS = 1000
    dify.llm_responder = lambda body: ['{"description": ', '"Picture of series 21"}']
    dify.llm_frame_gap = 4.0
    response = ask(client, described, query_images=[offer(dify, described, "slow", jpeg(21))])
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["items"] == []
    assert body["metrics"]["degradations"] == ["query-image-expansion-timeout"]


def test_deep_with_text_adds_one_expansion_of_the_image(dify, client, described):
    import json

    def vision(body):
        if isinstance(body["prompt_messages"][-1]["content"], list):
            return json.dumps({"description": "Picture of series 21", "ocrText": "",
                               "keywords": []})  # fmt: skip
        return None

    dify.llm_responder = vision
    dify.reset_observations()
    reference = offer(dify, described, "d", jpeg(21))
    body = ask(client, described, mode="deep", query="what is shown", query_images=[reference])
    assert body.status_code == 200, body.content
    body = body.json()
    assert body["metrics"]["query_images"]["expansion"] is True
    assert body["items"][0]["citation"]["filename"] == "pictures.docx"
    assert dify.llm_images_received == 1
    # Fast with text does not expand: the images are not used on this text-only space
    dify.reset_observations()
    fast = ask(client, described, query="what is shown", query_images=[reference]).json()
    assert fast["metrics"]["degradations"] == ["query-image-visual-leg-unavailable"]
    assert dify.llm_images_received == 0
