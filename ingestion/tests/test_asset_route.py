"""GET …/documents/{id}/assets/{asset}: stored document images served safely — inline only for
PNG/JPEG/GIF/WebP whose bytes match, with nosniff and the sandboxing CSP on every answer; other
types as attachments; 413 decided from the stored size before reading; variants; bad ids."""

from __future__ import annotations

import hashlib

import pytest

from ingestion.models import Document, ParseArtifact
from ingestion.tests.test_visual_projections import figures_pdf, pictures_docx
from knowledgefs import storage
from knowledgefs.testing.fixtures import compile_all, upload

pytestmark = pytest.mark.django_db

CSP = "default-src 'none'; sandbox"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def compiled(client, space, filename, data) -> Document:
    assert upload(client, space, filename, data).status_code in (201, 202)
    compile_all()
    document = Document.objects.get(space=space, filename=filename)
    assert document.state == "published", document.error_message
    return document


def url(space, document, asset, variant=None) -> str:
    base = f"/v1/knowledge-spaces/{space.id}/documents/{document.id}/assets/{asset}"
    return base + (f"?variant={variant}" if variant is not None else "")


def artifact(document) -> ParseArtifact:
    return ParseArtifact.objects.get(job_id=document.active_generation)


def assert_safe(response):
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Security-Policy"] == CSP


def test_a_docx_picture_is_served_inline_with_nosniff_and_csp(client, space):
    document = compiled(client, space, "pictures.docx", pictures_docx([1, 2]))
    stored = artifact(document).assets[1]
    response = client.get(url(space, document, 1))
    assert response.status_code == 200
    assert_safe(response)
    assert response["Content-Type"] == "image/png"
    assert response["Content-Disposition"].startswith("inline; ")
    body = b"".join(response) if response.streaming else response.content
    assert hashlib.sha256(body).hexdigest() == stored["sha256"]
    assert response["ETag"] == f'"{stored["sha256"]}"'


def test_a_pdf_page_image_and_its_thumbnail_variant(client, space):
    document = compiled(client, space, "figures.pdf", figures_pdf([5, 6]))
    assets = artifact(document).assets
    page = next(
        i for i, a in enumerate(assets) if a["kind"] == "page_image" and a["page_number"] == 2
    )
    thumb = next(a for a in assets if a["kind"] == "thumbnail" and a["page_number"] == 2)
    response = client.get(url(space, document, page, "thumbnail"))
    assert response.status_code == 200
    assert_safe(response)
    assert hashlib.sha256(response.content).hexdigest() == thumb["sha256"]
    assert len(response.content) < assets[page]["bytes"]


def test_other_types_and_mismatched_bytes_are_attachments(client, space):
    document = compiled(client, space, "pictures.docx", pictures_docx([3]))
    row = artifact(document)
    prefix = row.assets[0]["key"].rsplit("/", 1)[0]
    svg_key, fake_key = f"{prefix}/90.svg", f"{prefix}/91.png"
    storage.put_object(svg_key, SVG)
    storage.put_object(fake_key, SVG)  # SVG bytes recorded as a PNG
    extra = [
        {"key": svg_key, "kind": "image", "mime_type": "image/svg+xml", "bytes": len(SVG)},
        {"key": fake_key, "kind": "image", "mime_type": "image/png", "bytes": len(SVG)},
    ]
    ParseArtifact.objects.filter(id=row.id).update(assets=row.assets + extra)
    for index in (1, 2):
        response = client.get(url(space, document, index))
        assert response.status_code == 200
        assert_safe(response)
        assert response["Content-Type"] == "application/octet-stream"
        assert response["Content-Disposition"].startswith("attachment; ")
        assert response.content == SVG


def test_an_asset_over_the_read_limit_is_413_before_any_read(client, space, settings):
    document = compiled(client, space, "pictures.docx", pictures_docx([4]))
    asset = artifact(document).assets[0]
    settings.KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES = asset["bytes"] - 1
    storage.delete_object(asset["key"])  # a read would find nothing: 404, not 413
    response = client.get(url(space, document, 0))
    assert response.status_code == 413
    assert_safe(response)
    body = response.json()
    assert body["code"] == "asset_too_large"
    assert "KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES" in body["message"]


def test_bad_asset_ids_variants_and_disabled_documents(client, space):
    document = compiled(client, space, "pictures.docx", pictures_docx([7]))
    for asset in ("5", "abc", "-1", "１"):
        response = client.get(url(space, document, asset))
        assert response.status_code == 404 and response.json()["code"] == "asset_not_found"
        assert_safe(response)
    response = client.get(url(space, document, 0, "thumbnail"))
    assert (response.status_code, response.json()["code"]) == (404, "asset_variant_not_found")
    response = client.get(url(space, document, 0, "a/b"))
    assert (response.status_code, response.json()["code"]) == (400, "invalid_variant")
    response = client.get(url(space, document, 0, "x" * 65))
    assert (response.status_code, response.json()["code"]) == (400, "invalid_variant")
    Document.objects.filter(id=document.id).update(enabled=False)
    response = client.get(url(space, document, 0))
    assert (response.status_code, response.json()["code"]) == (409, "document_disabled")
