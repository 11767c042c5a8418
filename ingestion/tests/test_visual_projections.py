"""Visual projections: document images (PDF pages with figures, DOCX pictures) embedded in
compilation by an image-capable profile, in their own vector space, within the seed's bounds
(microbatches of at most 8 images / 32 MiB, 20 MiB per image, one lifecycle gate taken before any
read, cancellation before reads); a text-only profile never reads an image."""

from __future__ import annotations

import io
import threading
import time
import uuid

import docx
import numpy as np
import pytest
from PIL import Image, ImageDraw
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from ingestion.models import CompilationJob, Document, ParseArtifact, VisualProjection
from ingestion.visual import GATE, VisualCanceled, backfill_space, build_visual_projections
from knowledgefs import storage
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_images import image_vector
from knowledgefs.testing.dify_server import MULTIMODAL_EMBEDDING, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all, upload
from spaces import capabilities
from spaces.models import SpaceProfile
from spaces.services import create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

CLIP = {"plugin_id": "langgenius/jina", "provider": "jina", "model": "jina-clip-v2"}
OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
SPACES = "/v1/knowledge-spaces"
MIB = 1024 * 1024


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = 1
    dify_server.dimension = 64
    capabilities.set_catalog_lookup(None)
    return dify_server


def make_space(client, principal, embedding=CLIP):
    space = create_space(principal, name=f"Figures {uuid.uuid4().hex[:6]}")
    response = client.put(f"{SPACES}/{space.id}/embedding-profile", embedding, format="json")
    assert response.status_code == 200, response.content
    body = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert body["readiness"]["state"] == "ready", body["readiness"]
    return space


def picture(seed: int, size=(480, 360)) -> Image.Image:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for _ in range(7):
        x, y = rng.integers(0, size[0] - 120), rng.integers(0, size[1] - 120)
        w, h = rng.integers(40, 120, size=2)
        fill = tuple(int(v) for v in rng.integers(0, 200, 3))
        draw.rectangle([int(x), int(y), int(x + w), int(y + h)], fill=fill)
    return image


def png(image: Image.Image, fmt="PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def figures_pdf(seeds: list[int]) -> bytes:
    """One page per seed: a caption line and the figure filling the page."""
    out = io.BytesIO()
    pdf = canvas.Canvas(out, pagesize=(612, 792))
    for page, seed in enumerate(seeds, start=1):
        pdf.drawString(72, 740, f"Figure {page}: measured shapes of series {seed}")
        pdf.drawImage(ImageReader(picture(seed)), 36, 100, width=540, height=600)
        pdf.showPage()
    pdf.save()
    return out.getvalue()


def pictures_docx(seeds: list[int]) -> bytes:
    document = docx.Document()
    for seed in seeds:
        document.add_paragraph(f"Picture of series {seed}")
        document.add_picture(io.BytesIO(png(picture(seed))))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def published(space, filename) -> Document:
    document = Document.objects.get(space=space, filename=filename)
    assert document.state == "published", document.error_message
    return document


def visual_rows(document):
    return VisualProjection.objects.filter(
        document=document, generation=document.active_generation
    ).order_by("asset_index")


def nearest(space, query: bytes):
    rows = list(VisualProjection.objects.filter(space=space))
    matrix = np.stack([np.frombuffer(r.vector, dtype=np.float32) for r in rows])
    scores = matrix @ np.asarray(image_vector(query, rows[0].dimension), dtype=np.float32)
    order = np.argsort(-scores)
    return [(rows[i], float(scores[i])) for i in order]


# --- compilation --------------------------------------------------------------------------------


def test_pdf_figures_and_docx_pictures_are_embedded_and_the_same_picture_finds_its_page(
    dify, client, principal
):
    space = make_space(client, principal)
    dify.reset_observations()
    assert upload(client, space, "figures.pdf", figures_pdf([11, 12, 13])).status_code in (201, 202)
    assert upload(client, space, "pictures.docx", pictures_docx([21, 22])).status_code in (201, 202)
    compile_all()
    pdf, word = published(space, "figures.pdf"), published(space, "pictures.docx")
    pdf_assets = ParseArtifact.objects.get(job_id=pdf.active_generation).assets
    word_assets = ParseArtifact.objects.get(job_id=word.active_generation).assets
    embeddable = [a for a in pdf_assets if a["mime_type"] in ("image/png", "image/jpeg")]
    assert len(visual_rows(pdf)) == len(embeddable) >= 3
    assert {r.page_number for r in visual_rows(pdf)} >= {1, 2, 3}
    assert len(visual_rows(word)) == len(word_assets) == 2
    rows = VisualProjection.objects.filter(space=space)
    profile_space = SpaceProfile.objects.get(space_id=space.id).vector_space_id
    assert {r.vector_space_id for r in rows} == {profile_space}
    calls = dify.calls(MULTIMODAL_EMBEDDING)
    assert calls and all(len(c.body["documents"]) <= 8 for c in calls)
    assert dify.peak_image_request_bytes <= 32 * MIB
    # The figure of page 2, re-encoded as a JPEG query, finds page 2 of the PDF first.
    query = png(picture(12).resize((300, 225)), "JPEG")
    (top, score), (second, other) = nearest(space, query)[:2]
    assert (top.document_id, top.page_number) == (pdf.id, 2), (top.kind, score, other)
    # A DOCX picture finds its picture.
    (top, _), *_ = nearest(space, png(picture(22)))
    assert top.document_id == word.id


def test_a_text_only_profile_never_reads_or_embeds_an_image(dify, client, principal):
    space = make_space(client, principal, OPENAI)
    dify.reset_observations()
    assert upload(client, space, "pictures.docx", pictures_docx([31])).status_code in (201, 202)
    compile_all()
    published(space, "pictures.docx")
    assert dify.count(MULTIMODAL_EMBEDDING) == 0
    assert not VisualProjection.objects.filter(space=space).exists()


def test_a_new_generation_replaces_the_visual_projections_of_the_old(dify, client, principal):
    space = make_space(client, principal)
    data = pictures_docx([41, 42])
    assert upload(client, space, "pictures.docx", data).status_code in (201, 202)
    compile_all()
    document = published(space, "pictures.docx")
    first = document.active_generation
    again = upload(client, space, "pictures.docx", data, on_duplicate="replace")
    assert again.status_code in (201, 202), again.content
    compile_all()
    document.refresh_from_db()
    assert document.active_generation != first
    generations = VisualProjection.objects.filter(document=document).values_list(
        "generation", flat=True
    )
    assert list(generations) == [document.active_generation] * 2


# --- bounds -------------------------------------------------------------------------------------


def _job_with_assets(client, principal, count: int, size: int, seed=0):
    """A compiled CLIP space's job, and ``count`` PNG assets of about ``size`` bytes each stored
    under its key prefix (noise keeps PNG from compressing them)."""
    space = make_space(client, principal)
    assert upload(client, space, "note.md", b"# Note\n\nA page without images.").status_code in (
        201,
        202,
    )
    compile_all()
    document = published(space, "note.md")
    job = CompilationJob.objects.get(id=document.active_generation)
    rng = np.random.default_rng(seed)
    side = int((size / 3) ** 0.5)
    assets = []
    for index in range(count):
        pixels = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
        data = png(Image.fromarray(pixels))
        key = f"assets/{space.id}/{document.id}/{job.id}/extra-{index}.png"
        storage.put_object(key, data)
        import hashlib

        assets.append(
            {"key": key, "kind": "image", "page_number": index + 1, "mime_type": "image/png",
             "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )  # fmt: skip
    return space, job, assets


def test_microbatches_hold_at_most_the_batch_limits_and_flush_before_a_read_could_cross(
    dify, client, principal, settings
):
    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS = 3
    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES = 1 * MIB
    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES = 400 * 1024
    space, job, assets = _job_with_assets(client, principal, 10, 200 * 1024)
    sizes = [a["bytes"] for a in assets]
    assert all(150 * 1024 < s < 400 * 1024 for s in sizes), sizes
    dify.reset_observations()
    report = build_visual_projections(job, assets=assets)
    assert report.embedded == 10 and not report.skipped
    assert all(n <= 3 for n, _ in report.batches)
    assert all(b <= 1 * MIB for _, b in report.batches)
    # a batch is flushed as soon as it cannot hold one more maximum-sized image
    assert all(b + 400 * 1024 > 1 * MIB or n == 3 for n, b in report.batches[:-1])
    assert report.peak_raw_bytes <= 1 * MIB + 400 * 1024
    assert dify.count(MULTIMODAL_EMBEDDING) == report.requests == len(report.batches)
    assert dify.peak_image_request_bytes <= 1 * MIB


def test_an_image_larger_than_recorded_stops_at_the_limit_and_is_skipped(
    dify, client, principal, settings
):
    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES = 100 * 1024
    space, job, assets = _job_with_assets(client, principal, 2, 200 * 1024)
    small = dict(assets[0], bytes=1000)  # the record lies: the stored object is larger
    dify.reset_observations()
    report = build_visual_projections(job, assets=[small, assets[1]])
    assert report.embedded == 0
    assert report.skipped == {"too-large": 2}
    assert dify.count(MULTIMODAL_EMBEDDING) == 0


def test_cancellation_is_honoured_before_any_read(dify, client, principal):
    space, job, assets = _job_with_assets(client, principal, 1, 50 * 1024)
    missing = dict(assets[0], key=f"assets/{space.id}/nowhere.png")
    dify.reset_observations()
    with pytest.raises(VisualCanceled):
        build_visual_projections(job, assets=[missing], cancelled=lambda: True)
    assert GATE.active == 0
    assert dify.count(MULTIMODAL_EMBEDDING) == 0


def test_the_lifecycle_gate_admits_its_width_across_threads(dify, settings):
    from knowledgefs.dify.model_runtime import MultimodalDocument
    from knowledgefs.runtime import model_runtime

    settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY = 2
    dify.add_fault("delay", MULTIMODAL_EMBEDDING, seconds=0.4, times=None)
    image = png(picture(1))
    errors = []

    def lifecycle():
        try:
            GATE.acquire(lambda: False)
            try:
                for _ in range(2):
                    model_runtime().embed_multimodal(
                        tenant_id="t", provider="langgenius/jina/jina", model="jina-clip-v2",
                        documents=[MultimodalDocument(image)],
                    )  # fmt: skip
            finally:
                GATE.release()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    GATE.peak = 0
    threads = [threading.Thread(target=lifecycle) for _ in range(5)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert GATE.peak == 2 and dify.peak_in_flight(MULTIMODAL_EMBEDDING) == 2
    assert time.monotonic() - started >= 3 * 2 * 0.4 * 0.9  # ceil(5 / 2) rounds of two calls


def test_backfill_builds_missing_projections_and_removes_other_profiles(dify, client, principal):
    space = make_space(client, principal)
    assert upload(client, space, "pictures.docx", pictures_docx([51, 52])).status_code in (201, 202)
    compile_all()
    VisualProjection.objects.filter(space=space).update(vector_space_id="embedding-space-old")
    summary = backfill_space(space.id)
    assert summary == {"documents": 1, "embedded": 2, "removed": 2}
    assert set(
        VisualProjection.objects.filter(space=space).values_list("vector_space_id", flat=True)
    ) == {SpaceProfile.objects.get(space_id=space.id).vector_space_id}


def test_kfs_visual_backfill(dify, client, principal):
    from io import StringIO

    from django.core.management import call_command

    space = make_space(client, principal)
    assert upload(client, space, "pictures.docx", pictures_docx([61])).status_code in (201, 202)
    compile_all()
    VisualProjection.objects.filter(space=space).delete()
    out = StringIO()
    call_command("kfs", "visual", "backfill", "--space", space.slug, "--tenant",
                 space.tenant_id, "--json", stdout=out)  # fmt: skip
    assert '"embedded": 1' in out.getvalue()
    assert VisualProjection.objects.filter(space=space).count() == 1


def test_the_request_body_is_streamed_with_its_exact_length(dify):
    """Base64 is encoded while the body is sent (knowledgefs/dify/multimodal_body.py): the
    request still carries an exact Content-Length and decodes to the images."""
    import base64

    from knowledgefs.dify.model_runtime import MultimodalDocument
    from knowledgefs.runtime import model_runtime

    images = [png(picture(seed)) for seed in (1, 2, 3)]
    dify.reset_observations()
    vectors = model_runtime().embed_multimodal(
        tenant_id="t", provider="langgenius/jina/jina", model="jina-clip-v2",
        documents=[MultimodalDocument(data, file_id=f"f{n}") for n, data in enumerate(images)],
    )  # fmt: skip
    assert vectors.shape == (3, 64)
    (call,) = dify.calls(MULTIMODAL_EMBEDDING)
    assert "Transfer-Encoding" not in call.headers and int(call.headers["Content-Length"]) > 0
    sent = [base64.b64decode(d["content"]) for d in call.body["documents"]]
    assert sent == images and call.body["documents"][2]["file_id"] == "f2"
    assert call.body["input_type"] == "document" and call.body["model"] == "jina-clip-v2"


def test_a_dify_outage_retries_the_job_and_a_refusal_publishes_the_text(dify, client, principal):
    space = make_space(client, principal)
    dify.add_fault("status", MULTIMODAL_EMBEDDING, status=503, times=None)
    assert upload(client, space, "a.docx", pictures_docx([71])).status_code in (201, 202)
    compile_all()
    job = CompilationJob.objects.get(document__filename="a.docx")
    # retried (the drain runs the due retries) until its attempts are spent, never published
    assert job.error_code == "visual_embedding_unavailable"
    assert job.run_state in ("retry_wait", "failed") and job.execution_attempts >= 2
    assert Document.objects.get(id=job.document_id).state != "published"
    dify.clear_faults()
    dify.add_fault("status", MULTIMODAL_EMBEDDING, status=400, times=None)
    assert upload(client, space, "b.docx", pictures_docx([72])).status_code in (201, 202)
    compile_all()
    document = published(space, "b.docx")
    assert not VisualProjection.objects.filter(document=document).exists()
