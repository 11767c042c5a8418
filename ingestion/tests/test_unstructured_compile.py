"""Compilation through the Unstructured-compatible parser (UNSTRUCTURED_API_URL set): complex
formats go remote and publish the service's elements, native formats stay native, failures keep
the client's codes (retryable only when the parser was unavailable), a format the service does
not support (415) is parsed natively with a warning, and a ZIP bomb never reaches the service."""

from __future__ import annotations

import io
import zipfile

import pytest

from ingestion.compilation.pipeline import run_job
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, ParseArtifact
from ingestion.tests import test_unstructured_client
from knowledgefs.errors import InvalidInput

pytestmark = pytest.mark.django_db

#: The contract server on loopback with the seed's limits and short deadlines.
parser = test_unstructured_client.parser

MIB = 1024 * 1024


def _docx(text: str) -> bytes:
    import docx

    document = docx.Document()
    document.add_paragraph(text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def _compile(space, name: str, data: bytes) -> tuple[str, Document]:
    admission = admit_document(space, filename=name, data=data, enqueue=False)
    outcome = run_job(admission.job.id)
    return outcome, Document.objects.get(id=admission.document.id)


def _texts(document: Document) -> str:
    return "\n".join(
        KnowledgeNode.objects.filter(
            document=document, generation=document.active_generation
        ).values_list("text", flat=True)
    )


def test_a_docx_is_parsed_remotely_and_published(space, parser):
    parser.elements = [
        {"type": "Title", "text": "Remote heading", "metadata": {"page_number": 1}},
        {"type": "NarrativeText", "text": "Parsed by the service: KESTREL-42.",
         "metadata": {"page_number": 1}},
        {"type": "Table", "text": "Team Cups Blues 1", "metadata": {
            "page_number": 2,
            "text_as_html": "<table><tr><td>Team</td><td>Cups</td></tr>"
                            "<tr><td>Blues</td><td>1</td></tr></table>"}},
    ]  # fmt: skip
    outcome, document = _compile(space, "report.docx", _docx("native text NATIVE-ONLY"))
    assert outcome == "succeeded"
    assert document.state == "published"
    artifact = ParseArtifact.objects.get(document=document)
    assert artifact.parser == "unstructured"
    texts = _texts(document)
    assert "KESTREL-42" in texts and "| Blues | 1 |" in texts
    assert "NATIVE-ONLY" not in texts
    [sent] = parser.requests
    assert sent.filename == "report.docx"


def test_plain_text_stays_native(space, parser):
    outcome, document = _compile(space, "notes.txt", b"Plain text stays with the native parser.")
    assert outcome == "succeeded"
    assert ParseArtifact.objects.get(document=document).parser == "native-text"
    assert parser.requests == []


def test_an_unavailable_parser_is_a_retryable_failure(space, parser, settings):
    settings.KNOWLEDGE_JOB_MAX_ATTEMPTS = 1
    parser.add_fault("status", status=503, times=None)
    outcome, document = _compile(space, "report.docx", _docx("text"))
    job = CompilationJob.objects.get(document=document)
    assert outcome == "failed"
    assert (job.error_code, job.error_retryable) == ("parser_unavailable", True)
    assert document.state == "failed"
    assert not KnowledgeNode.objects.filter(document=document).exists()


def test_a_parser_timeout_is_terminal(space, parser, settings):
    settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS = 1500
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 1500
    parser.add_fault("hang")
    outcome, document = _compile(space, "report.docx", _docx("text"))
    job = CompilationJob.objects.get(document=document)
    assert outcome == "failed"
    assert (job.error_code, job.error_retryable) == ("parser_timeout", False)
    assert "retry manually" in job.error_message


def test_a_format_the_service_refuses_with_415_is_parsed_natively(space, parser):
    parser.add_fault("status", status=415, detail="File type not supported")
    outcome, document = _compile(space, "report.docx", _docx("Fallback text ORIOLE-7."))
    assert outcome == "succeeded"
    artifact = ParseArtifact.objects.get(document=document)
    assert artifact.parser == "python-docx"
    assert "ORIOLE-7" in _texts(document)
    assert any("415" in warning for warning in artifact.warnings)


def test_a_zip_bomb_never_reaches_the_service(space, parser):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as container:
        container.writestr("[Content_Types].xml", "<Types/>")
        container.writestr("word/document.xml", b"\0" * (300 * MIB))
    with pytest.raises(InvalidInput) as refused:
        admit_document(space, filename="bomb.docx", data=buffer.getvalue(), enqueue=False)
    assert refused.value.code == "archive_rejected"
    assert parser.requests == []
    assert not Document.objects.exists()


def test_a_utf16_or_mbox_wrapped_email_is_unwrapped_natively_not_sent_raw(space, parser):
    message = (
        "From: ann@example.com\r\nTo: bob@example.com\r\nSubject: Wrapped\r\n"
        "Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\nThe body says OSPREY-7.\r\n"
    )
    for name, data in (
        ("utf16.eml", b"\xff\xfe" + message.encode("utf-16-le")),
        ("gmail.eml", ("From 17@xxx Mon Jan 01 10:00:05 +0000 2024\r\n" + message).encode()),
    ):
        outcome, document = _compile(space, name, data)
        assert document.mime_type == "message/rfc822"
        assert document.state == "published", (name, outcome)
        assert "The body says OSPREY-7." in _texts(document)
        assert "Subject: Wrapped" in _texts(document)
        assert ParseArtifact.objects.get(document=document).parser == "native-email"
    assert parser.requests == []
