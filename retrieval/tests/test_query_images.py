"""Query images on retrieval tests: resolved through Dify's inner API for one run, searched in
the visual space (each image on its own, fused by rank), the limits and bad input with their
codes, text-only spaces (the clear 400, or the images ignored with the degradation recorded), a
stalled Dify image stream (deadline, degradation, no 500); Deep and Research with one
image-to-text expansion, durable research tasks persisting it (a resumed task does not repeat it)
and counting it in their plan and budget."""

from __future__ import annotations

import json
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


def test_research_with_text_on_a_space_without_a_vision_model_ignores_the_images(
    dify, client, figures
):
    reference = offer(dify, figures, "r", jpeg(1))
    response = ask(client, figures, mode="research", query="measured shapes",
                   query_images=[reference])  # fmt: skip
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["mode"] == "research" and body["items"]
    assert body["metrics"]["degradations"] == ["query-image-ignored-no-vision-model"]
    assert body["metrics"]["query_images"]["expansion"] is False
    assert dify.count(QUERY_IMAGE) == 0  # the bytes are never loaded
    # image-only Research has nothing to read the image with: the clear 400
    response = ask(client, figures, mode="research", query_images=[reference])
    assert (response.status_code, response.json()["code"]) == (400, "query_image_requires_vision")
    assert "reasoning model that accepts images" in response.json()["message"]


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


def vision_model(description: str = "Picture of series 21"):
    def answer(body):
        if isinstance(body["prompt_messages"][-1]["content"], list):
            return json.dumps({"description": description, "ocrText": "", "keywords": []})
        return None  # Research's planner, judge: the server's fixed answer (not JSON: degraded)

    return answer


def test_research_reads_the_images_through_one_expansion(dify, client, described):
    dify.llm_responder = vision_model()
    dify.reset_observations()
    reference = offer(dify, described, "res", jpeg(21))
    for body in ({"query": "what is shown"}, {}):  # with text, and image-only
        dify.reset_observations()
        response = ask(client, described, mode="research", query_images=[reference], **body)
        assert response.status_code == 200, response.content
        result = response.json()
        assert result["mode"] == "research"
        assert result["items"][0]["citation"]["filename"] == "pictures.docx"
        assert result["metrics"]["query_images"]["expansion"] is True
        assert result["metrics"]["degradations"] == []
        assert dify.llm_images_received == 1  # one expansion; the planner gets no image
        assert dify.count(QUERY_IMAGE) == 1
        stage = next(s for s in result["stages"] if s["name"] == "image_expansion")
        assert stage["status"] == "executed"
        # the expansion counts as a model call of the run
        assert result["metrics"]["research_model_calls"] >= 2
    # /v1/queries in Research: the answer's trace records the images and the expansion
    body = {"space_id": str(described.id), "mode": "research", "query_images": [reference]}
    response = client.post("/v1/queries", body, format="json")
    assert response.status_code == 200, response.content
    assert "event: answer.done" in b"".join(response.streaming_content).decode()
    trace = client.get(f"/v1/queries/{response['X-Query-Run-Id']}").json()
    step = next(s for s in trace["steps"] if s["name"] == "query.images")
    assert step["status"] == "ok" and step["metadata"]["expansion"] is True
    assert step["metadata"]["degradations"] == []


def test_a_slow_research_expansion_is_the_timeout_degradation(dify, client, described, settings):
    settings.KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS = 1000

    def slow(body):
        if isinstance(body["prompt_messages"][-1]["content"], list):
            return ['{"description": ', '"Picture of series 21"}']
        return None

    dify.llm_responder = slow
    dify.llm_frame_gap = 4.0
    reference = offer(dify, described, "slow-r", jpeg(21))
    response = ask(client, described, mode="research", query="receipts due",
                   query_images=[reference])  # fmt: skip
    dify.llm_frame_gap = 0.0
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["metrics"]["degradations"] == ["query-image-expansion-timeout"]
    assert body["items"][0]["citation"]["filename"] == "other.md"  # the text still answered
    stage = next(s for s in body["stages"] if s["name"] == "image_expansion")
    assert stage["status"] == "degraded"


def test_a_stalled_image_stream_in_research_is_the_visual_leg_degradation(
    dify, client, described, settings
):
    settings.KNOWLEDGE_QUERY_IMAGE_FETCH_TIMEOUT_S = 1.5
    dify.llm_responder = vision_model()
    reference = offer(dify, described, "stall-r", jpeg(21))
    dify.add_fault("stall", QUERY_IMAGE, after_bytes=100, seconds=4)
    dify.reset_observations()
    response = ask(client, described, mode="research", query="receipts due",
                   query_images=[reference])  # fmt: skip
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["metrics"]["degradations"] == ["query-image-visual-leg-unavailable"]
    assert body["items"] and dify.llm_images_received == 0


def test_a_research_task_persists_its_expansion_and_a_resume_does_not_repeat_it(
    dify, client, described, django_capture_on_commit_callbacks
):
    from retrieval.research_tasks import service, tasks
    from retrieval.research_tasks.models import ResearchTask, RunState

    dify.llm_responder = vision_model()
    reference = offer(dify, described, "task-1", jpeg(21))
    base = {"space_id": str(described.id), "query": "", "query_images": [reference]}
    # the dry run counts the expansion: one more call, its tokens, its time
    plan = client.post("/v1/research-tasks/plan", base, format="json").json()
    text_plan = client.post(
        "/v1/research-tasks/plan", {**base, "query": "x", "query_images": []}, format="json"
    ).json()
    assert plan["model_calls"] == {"min": text_plan["model_calls"]["min"] + 1,
                                   "max": text_plan["model_calls"]["max"] + 1}  # fmt: skip
    assert plan["steps"][0] == {
        "name": "image_expansion",
        "model_call": True,
        "status": "planned",
        "description": "one image-to-text expansion of the query images by the reasoning "
        "model, searched with the question",
    }
    assert plan["tokens"]["input"]["max"] > text_plan["tokens"]["input"]["max"]
    assert plan["latency_ms"]["p50"] == text_plan["latency_ms"]["p50"] + 8000
    assert plan["limits"]["max_model_calls"] == 4 and plan["violations"] == []
    assert plan["query_images"] == {"count": 1, "expansion": True}
    dify.reset_observations()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/v1/research-tasks", base, format="json")
    assert response.status_code == 202, response.content
    created = response.json()
    assert created["query_images"] == [{"upload_file_id": "task-1"}]
    task = ResearchTask.objects.get(id=created["id"])
    assert tasks.run_research_task(str(task.id), task.task_id) == "completed"
    task.refresh_from_db()
    saved = task.checkpoint["image_expansion"]
    assert saved["status"] == "ok" and "Picture of series 21" in saved["output"]["text"]
    (record,) = saved["images"]
    assert set(record) == {"upload_file_id", "sha256", "byte_size", "mime_type"}
    metrics = task.result["metrics"]
    assert metrics["query_images"]["expansion"] is True and metrics["degradations"] == []
    assert task.result["items"][0]["citation"]["filename"] == "pictures.docx"
    assert (dify.llm_images_received, dify.count(QUERY_IMAGE)) == (1, 1)
    # a delivery that died after the expansion: the resumed task reuses the derived text
    ResearchTask.objects.filter(id=task.id).update(run_state=RunState.FAILED, result=None)
    with django_capture_on_commit_callbacks(execute=True):
        service.resume_task(task.id)
    task.refresh_from_db()
    assert tasks.run_research_task(str(task.id), task.task_id) == "completed"
    task.refresh_from_db()
    assert (dify.llm_images_received, dify.count(QUERY_IMAGE)) == (1, 1)  # not repeated
    assert task.result["metrics"]["research_model_calls_reused"] >= 1
    assert task.result["items"][0]["citation"]["filename"] == "pictures.docx"


def test_a_research_task_expansion_timeout_is_in_its_terminal_metadata(
    dify, client, described, settings, django_capture_on_commit_callbacks
):
    from retrieval.research_tasks import tasks
    from retrieval.research_tasks.models import ResearchTask

    settings.KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS = 1000
    dify.llm_responder = lambda body: (
        ['{"description": ', '"x"}']
        if isinstance(body["prompt_messages"][-1]["content"], list)
        else None
    )
    dify.llm_frame_gap = 4.0
    body = {"space_id": str(described.id), "query": "receipts due",
            "query_images": [offer(dify, described, "task-slow", jpeg(21))]}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        created = client.post("/v1/research-tasks", body, format="json").json()
    task = ResearchTask.objects.get(id=created["id"])
    try:
        assert tasks.run_research_task(str(task.id), task.task_id) == "completed"
    finally:
        dify.llm_frame_gap = 0.0
    task.refresh_from_db()
    assert task.result["metrics"]["degradations"] == ["query-image-expansion-timeout"]
    assert task.checkpoint["image_expansion"]["status"] == "failed"
    shown = client.get(f"/v1/research-tasks/{task.id}").json()
    assert shown["result"]["metrics"]["degradations"] == ["query-image-expansion-timeout"]


def test_research_task_image_bodies_are_checked_at_admission(dify, client, figures, described):
    five = [{"upload_file_id": str(n)} for n in range(5)]
    response = client.post("/v1/research-tasks", {"space_id": str(described.id), "query": "x",
                                                  "query_images": five}, format="json")  # fmt: skip
    assert (response.status_code, response.json()["code"]) == (413, "query_image_count_exceeded")
    # image-only on a space whose reasoning model cannot see: the 400, nothing created
    response = client.post("/v1/research-tasks", {"space_id": str(figures.id),
                           "query_images": [{"upload_file_id": "a"}]}, format="json")  # fmt: skip
    assert (response.status_code, response.json()["code"]) == (400, "query_image_requires_vision")
    # the expansion's call may be limited like the others: 0..4 with images, 0..3 without
    body = {"space_id": str(described.id), "query": "x", "limits": {"max_model_calls": 4}}
    response = client.post("/v1/research-tasks/plan", body, format="json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid_limits")
    body["query_images"] = [{"upload_file_id": "a"}]
    assert client.post("/v1/research-tasks/plan", body, format="json").status_code == 200
