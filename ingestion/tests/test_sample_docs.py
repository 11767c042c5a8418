"""Every file in ``../shared/data/sample-docs`` compiles to ``published`` through the real pipeline.

Each document is admitted like an upload (content sniffing, storage), compiled by the compilation
service (isolated parse, OCR, rasterization, chunking, embedding, indexing, publication) and its
stored chunks must contain strings that are really in the file: body text, table cells, e-mail
headers, slide notes, the OCR'd text of the scan. A keyword query must then find the document.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ingestion.compilation.pipeline import run_job
from ingestion.documents import admit_document
from ingestion.models import Document, KnowledgeNode, ParseArtifact
from retrieval.modes import retrieve

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "data" / "sample-docs"

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not SAMPLES.is_dir(), reason="../shared/data/sample-docs is absent"),
]

#: file -> (strings that must appear in its chunks, a keyword query that must find it)
EXPECTED: dict[str, tuple[tuple[str, ...], str]] = {
    "codeblock.md": (("Hello, World!", "<to>Tove</to>", "XML Example"), "Tove"),
    "contains-pictures.docx": (
        ("floating picture that appears on top of the text", "An inline picture appears here"),
        "floating picture",
    ),
    "docx-tables.docx": (
        ("Header Col 1", "A link example", "Table with merged cells", "Nested Table"),
        "uniform table",
    ),
    "email-with-image.eml": (
        ("email-with-image", "The unstructured logo is attached", "unstructured_logo.png"),
        "unstructured logo attached",
    ),
    "embedded-images-tables.pdf": (
        ("Potentiodynamic polarization data", "0.0335", "Corrosion"),
        "potentiodynamic polarization stainless steel",
    ),
    "example-10k-1p.html": (
        ("Galaxy Gaming, Inc.", "6480 Cameron Street", "GLXZ", "OTCQB"),
        "Galaxy Gaming Cameron Street",
    ),
    "fake-email.eml": (
        ("Test Email", "This is a test email to use for unit tests.", "Roses are red"),
        "violets blue",
    ),
    "fake-email.msg": (
        ("Test Email", "This is a test email to use for unit tests.", "Violets are blue"),
        "roses red",
    ),
    "fake-html.html": (
        ("My First Heading", "Row 2, Cell 1", "With sub-bullets!"),
        "cow hooves",
    ),
    "fake-power-point.pptx": (
        ("Adding a Bullet Slide", "Here is some text in a text box!"),
        "bullet slide layout",
    ),
    "fake.docx": (("Lorem ipsum dolor sit amet.",), "lorem ipsum"),
    "loremipsum-flat.pdf": (("Lorem ipsum", "dolor"), "lorem ipsum dolor"),
    "sample-presentation.pptx": (
        ("This is kinda backwards, huh?", "Sub-details 2", "This is the first content slide"),
        "sub-sub-detail",
    ),
    "stanley-cups.csv": (("Maple Leafs", "TOR", "13"), "Maple Leafs"),
    "stanley-cups.xlsx": (("Stanley Cups Since 67", "Maple Leafs", "PHI"), "Flyers PHI"),
    "winter-sports.epub": (
        ("Winter Sports", "mohawks and choctaws", "outside forward mohawk"),
        "mohawks choctaws",
    ),
}

#: Files whose figures must reach storage as assets (images / rasterized page images).
WITH_ASSETS = {"contains-pictures.docx", "embedded-images-tables.pdf", "email-with-image.eml"}


def test_every_sample_file_has_expectations():
    assert sorted(EXPECTED) == sorted(p.name for p in SAMPLES.iterdir() if p.name != "README.md")


def _ocr_available() -> bool:
    return shutil.which("tesseract") is not None and shutil.which("pdftoppm") is not None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_document_compiles_to_published(space, name):
    if name == "loremipsum-flat.pdf" and not _ocr_available():
        if os.environ.get("KFS_REQUIRE_OCR") == "1":
            pytest.fail("tesseract/pdftoppm missing but KFS_REQUIRE_OCR=1")
        pytest.skip("tesseract or pdftoppm is not installed (make ocr)")
    strings, query = EXPECTED[name]
    admission = admit_document(
        space, filename=name, data=(SAMPLES / name).read_bytes(), enqueue=False
    )
    assert run_job(admission.job.id) == "succeeded"
    document = Document.objects.get(id=admission.document.id)
    assert document.state == "published", (document.error_code, document.error_message)
    texts = list(
        KnowledgeNode.objects.filter(
            document=document, generation=document.active_generation
        ).values_list("text", flat=True)
    )
    assert texts and all(t.strip() for t in texts)
    joined = "\n".join(texts)
    for expected in strings:
        assert expected in joined, f"{expected!r} not in the chunks of {name}"
    hits = retrieve(space, query, top_k=5).items
    assert any(hit.citation["document_id"] == str(document.id) for hit in hits), query
    if name in WITH_ASSETS:
        artifact = ParseArtifact.objects.get(job_id=admission.job.id)
        assert artifact.assets, f"no asset stored for {name}"
