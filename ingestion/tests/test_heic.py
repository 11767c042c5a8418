"""HEIC/HEIF photos: sniffed by their ``ftyp`` brand, opened through pillow-heif's Pillow opener
and OCR'd like the other image formats; uploaded and compiled end to end.

The HEIC files are written by pillow-heif in the test; real ``tesseract`` (skipped when missing
unless ``KFS_REQUIRE_OCR=1``).
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from ingestion.models import Document
from ingestion.parsing import parse_with_report
from ingestion.parsing.sniff import ContentMismatch, sniff_mime_type
from knowledgefs.testing.fixtures import compile_all, upload
from knowledgefs.testing.pdf_fixtures import require_ocr, text_image
from retrieval.modes import retrieve

pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif not installed (pyproject)")


def heic_bytes(image: Image.Image, *, brand_heif: bool = False) -> bytes:
    """``image`` encoded by pillow-heif (HEVC: an iPhone-style ``ftypheic`` file)."""
    heif = pillow_heif.from_pillow(image)
    buffer = io.BytesIO()
    heif.save(buffer, quality=95)
    data = buffer.getvalue()
    if brand_heif:  # the generic HEIF image brand, as some cameras write it
        data = data[:8] + b"mif1" + data[12:]
    return data


def test_heic_and_heif_are_sniffed_by_content_whatever_their_name():
    data = heic_bytes(Image.new("RGB", (64, 64), "white"))
    assert data[4:12] == b"ftypheic"
    assert sniff_mime_type(data, "IMG_0042.HEIC") == "image/heic"
    assert sniff_mime_type(data, "photo.dat") == "image/heic"
    assert sniff_mime_type(heic_bytes(Image.new("RGB", (8, 8)), brand_heif=True), "x") == (
        "image/heif"
    )
    with pytest.raises(ContentMismatch) as raised:
        sniff_mime_type(data, "report.pdf")
    assert raised.value.message == "content mismatch: named .pdf but the content is a HEIC image"


@pytest.mark.parametrize("mime", ["image/heic", "image/heif"])
def test_a_heic_photo_is_ocrd_like_the_other_image_formats(mime):
    require_ocr()
    report = parse_with_report(heic_bytes(text_image("RECEIPT 0815")), mime)
    assert (report.page_count, report.ocr_pages, report.parser) == (1, [1], "tesseract")
    assert [(e.text, e.page_number, e.metadata) for e in report.elements] == [
        ("RECEIPT 0815", 1, {"ocr": True})
    ]


def test_a_damaged_heic_is_corrupt_image():
    data = heic_bytes(Image.new("RGB", (64, 64), "white"))
    with pytest.raises(Exception) as raised:
        parse_with_report(data[: len(data) // 2], "image/heic")
    assert getattr(raised.value, "code", None) == "corrupt_image"


@pytest.mark.django_db
def test_an_uploaded_heic_photo_is_compiled_and_found(client, space):
    require_ocr()
    data = heic_bytes(text_image("WAREHOUSE 4711"))
    response = upload(client, space, "IMG_2048.heic", data)
    assert response.status_code == 202, response.content
    compile_all()
    document = Document.objects.get()
    assert (document.state, document.mime_type) == ("published", "image/heic")
    hits = retrieve(space, "warehouse 4711", top_k=3).items
    assert hits and "WAREHOUSE 4711" in hits[0].text
