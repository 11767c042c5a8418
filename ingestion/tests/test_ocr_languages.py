"""OCR in scripts the configured languages (``eng``) do not cover: Tesseract's OSD names the
script, the installed language data for it reads the page (Chinese, Korean beside English);
without that data the page is ``ocr_language_unavailable``, with only a low-confidence reading
``ocr_low_confidence``, and no garbage is indexed. English is read as before.

Real ``tesseract`` with Debian's language data (``make ocr``) and text drawn by Pillow in Noto
CJK (``fonts-noto-cjk``); skipped when missing unless ``KFS_REQUIRE_OCR=1`` (CI). A data
directory holding only some ``.traineddata`` files (``TESSDATA_PREFIX``) stands for a server
without the others.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas

from ingestion.compilation.pipeline import run_job
from ingestion.documents import admit_document
from ingestion.models import Document, KnowledgeNode
from ingestion.parsing import ParseError, parse_with_report
from knowledgefs.testing.pdf_fixtures import png_bytes, require_ocr
from retrieval.modes import retrieve

CJK_FONTS = [
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc",
]
TESSDATA = Path("/usr/share/tesseract-ocr/5/tessdata")
CHINESE = "知识库服务把文档编译成段落。\n每一页都会被识别并建立索引。\n检索结果带有引用和页码。"
KOREAN = "지식 저장소는 문서를 만듭니다.\n모든 페이지는 색인됩니다.\n검색 결과에는 인용이 있습니다."
ENGLISH = "The knowledge service compiles documents\ninto searchable passages with citations."


def _require(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("KFS_REQUIRE_OCR") == "1":
        pytest.fail(message)
    pytest.skip(message)


def _installed() -> set[str]:
    done = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True)
    return {line.strip() for line in (done.stdout + done.stderr).splitlines()[1:]}


@pytest.fixture
def cjk_font() -> str:
    require_ocr()
    font = next((path for path in CJK_FONTS if os.path.exists(path)), None)
    _require(font is not None, "no CJK font (Debian fonts-noto-cjk; make ocr)")
    missing = {"chi_sim", "kor", "osd"} - _installed()
    _require(not missing, f"Tesseract language data missing: {sorted(missing)} (make ocr)")
    return font


def _image(text: str, font: str) -> Image.Image:
    image = Image.new("L", (1400, 600), 255)
    draw = ImageDraw.Draw(image)
    face = ImageFont.truetype(font, 44, index=0)
    draw.multiline_text((60, 80), text, fill=0, font=face, spacing=40)
    return image


def _png(text: str, font: str) -> bytes:
    return png_bytes(_image(text, font))


@pytest.fixture
def eng_only(tmp_path, monkeypatch):
    """A Tesseract data directory with English and OSD only (plus the output configs)."""
    data = tmp_path / "tessdata"
    data.mkdir()
    for name in ("eng.traineddata", "osd.traineddata", "configs"):
        os.symlink(TESSDATA / name, data / name)
    monkeypatch.setenv("TESSDATA_PREFIX", str(data))
    return data


def test_a_chinese_image_is_read_with_the_chinese_language_data(cjk_font):
    report = parse_with_report(_png(CHINESE, cjk_font), "image/png")
    text = "\n".join(e.text for e in report.elements)
    assert "知识库服务" in text and "建立索引" in text
    assert report.ocr_pages == [1] and report.warnings == []


def test_a_korean_image_is_read_with_the_korean_language_data(cjk_font):
    report = parse_with_report(_png(KOREAN, cjk_font), "image/png")
    text = "\n".join(e.text for e in report.elements)
    assert "지식 저장소는 문서를 만듭니다." in text
    assert "검색 결과에는 인용이 있습니다." in text


def test_an_english_image_is_read_as_before(cjk_font):
    report = parse_with_report(_png(ENGLISH, cjk_font), "image/png")
    assert " ".join(e.text for e in report.elements).split() == ENGLISH.split()
    assert report.warnings == []


def test_without_the_scripts_language_data_the_image_is_ocr_language_unavailable(
    cjk_font, eng_only
):
    with pytest.raises(ParseError) as raised:
        parse_with_report(_png(KOREAN, cjk_font), "image/png")
    assert raised.value.code == "ocr_language_unavailable"
    assert "Korean (Hangul) script" in raised.value.message
    assert "wanted: kor; configured: eng" in raised.value.message
    # English still reads with the same data directory.
    assert parse_with_report(_png(ENGLISH, cjk_font), "image/png").elements


def test_a_low_confidence_reading_is_ocr_low_confidence(cjk_font, eng_only):
    os.unlink(eng_only / "osd.traineddata")  # no script detection: only English to try
    with pytest.raises(ParseError) as raised:
        parse_with_report(_png(CHINESE, cjk_font), "image/png")
    assert raised.value.code == "ocr_low_confidence"
    assert "mean word confidence" in raised.value.message


def _scan_pdf(text_page: str, scan: bytes) -> bytes:
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=(612, 792))
    if text_page:
        pdf.drawString(72, 700, text_page)
        pdf.showPage()
    pdf.drawImage(ImageReader(io.BytesIO(scan)), 36, 400, 540, 231)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def test_a_pdf_page_in_a_missing_language_is_recorded_and_not_indexed(cjk_font, eng_only):
    data = _scan_pdf("Quarterly statement for the northern warehouse.", _png(KOREAN, cjk_font))
    report = parse_with_report(data, "application/pdf")
    assert [e.text for e in report.elements] == ["Quarterly statement for the northern warehouse."]
    assert report.pages_without_text == [2] and report.ocr_pages == []
    assert report.warnings[0].startswith("page 2: no text layer (ocr_language_unavailable: ")
    # A scan with nothing else fails the document with the code.
    with pytest.raises(ParseError) as raised:
        parse_with_report(_scan_pdf("", _png(KOREAN, cjk_font)), "application/pdf")
    assert raised.value.code == "ocr_language_unavailable"


@pytest.mark.django_db
@pytest.mark.timeout(180)
def test_a_chinese_scan_page_is_compiled_and_found_by_a_chinese_query(space, cjk_font):
    data = _scan_pdf("Quarterly statement for the northern warehouse.", _png(CHINESE, cjk_font))
    admission = admit_document(space, filename="scan-zh.pdf", data=data, enqueue=False)
    run_job(admission.job.id)
    document = Document.objects.get(id=admission.document.id)
    assert document.state == "published", document.error_message
    texts = "\n".join(
        KnowledgeNode.objects.filter(document=document).values_list("text", flat=True)
    )
    assert "知识库服务" in texts
    hits = retrieve(space, "知识库服务", top_k=3).items
    assert hits and "知识库服务" in hits[0].text and hits[0].citation["page_number"] == 2
