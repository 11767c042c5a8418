"""Case BC-48: URLs a document supplies (Markdown and HTML images, DOCX linked pictures and
hyperlinks) are never fetched: no socket is opened for them while parsing or compiling, each
image is recorded as a parse warning, and the text is indexed."""

from __future__ import annotations

import http.server
import io
import socket
import threading
from collections.abc import Iterator

import docx
import pytest
from docx.opc.constants import RELATIONSHIP_TYPE as RT
from docx.oxml import OxmlElement
from docx.oxml.ns import qn

from ingestion.models import Document, KnowledgeNode, ParseArtifact
from ingestion.parsing import parse_with_report, sniff_mime_type
from knowledgefs.testing.fixtures import compile_all, upload

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
HOSTILE = [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:5432/",
    "http://[::1]:8000/admin",
    "file:///etc/passwd",
]


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers every request with a 302 to a loopback service, counting the requests."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.1:5432/")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirect_stub() -> Iterator[tuple[str, list[str]]]:
    """A real local HTTP server that 302-redirects to 127.0.0.1; its URL and request log."""
    requests: list[str] = []
    handler = type("Stub", (_Stub,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/pixel.png", requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def socket_guard(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every outgoing connection of this process is recorded and refused."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network access refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(None, address))  # type: ignore[arg-type]
    return attempts


def markdown_doc(urls: list[str]) -> bytes:
    images = "\n\n".join(f"![diagram {i}]({url})" for i, url in enumerate(urls))
    return (
        "# Network policy\n\nThe firewall blocks inbound traffic on port 22.\n\n"
        f"{images}\n\n[ref]: {urls[0]}\n\n![again][ref]\n\n"
        f'<img src="{urls[1]}" alt="raw html image">\n'
    ).encode()


def html_doc(urls: list[str]) -> bytes:
    images = "".join(f'<img src="{url}" alt="x">' for url in urls)
    return (
        "<html><body><h1>Network policy</h1>"
        f"<p>The firewall blocks inbound traffic on port 22.</p>{images}"
        f'<picture><source srcset="{urls[0]} 2x"></picture></body></html>'
    ).encode()


def docx_doc(urls: list[str]) -> bytes:
    document = docx.Document()
    document.add_heading("Network policy", level=1)
    paragraph = document.add_paragraph("The firewall blocks inbound traffic on port 22. ")
    part = document.part
    for url in urls:
        link = OxmlElement("w:hyperlink")
        link.set(qn("r:id"), part.relate_to(url, RT.HYPERLINK, is_external=True))
        run = OxmlElement("w:r")
        text = OxmlElement("w:t")
        text.text = f"see {url.split(':')[0]} link"
        run.append(text)
        link.append(run)
        paragraph._p.append(link)
        part.relate_to(url, RT.IMAGE, is_external=True)  # a picture linked, not embedded
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


BUILDERS = {"policy.md": markdown_doc, "policy.html": html_doc, "policy.docx": docx_doc}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_bc48_parsing_opens_no_socket_and_records_each_image(
    name: str, redirect_stub: tuple[str, list[str]], socket_guard: list[object]
) -> None:
    stub_url, stub_requests = redirect_stub
    urls = [*HOSTILE, stub_url]
    data = BUILDERS[name](urls)
    report = parse_with_report(data, sniff_mime_type(data, name))
    assert socket_guard == []
    assert stub_requests == []
    assert "The firewall blocks inbound traffic on port 22." in "\n".join(
        e.text for e in report.elements
    )
    assert report.warnings == [
        f"image not fetched (document-supplied URLs are never fetched): {url}" for url in urls
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(BUILDERS))
def test_bc48_compilation_fetches_nothing_and_publishes_the_text(
    name: str, client, space, redirect_stub: tuple[str, list[str]]
) -> None:
    # The parse runs in the isolated child process, where a guard of this process does not
    # reach: a real listener (the redirect stub) sees any request, whatever process makes it.
    stub_url, stub_requests = redirect_stub
    data = BUILDERS[name]([*HOSTILE, stub_url])
    assert upload(client, space, name, data).status_code == 202
    compile_all()
    document = Document.objects.get()
    assert document.state == "published", document.error_code
    assert stub_requests == []
    texts = "\n".join(KnowledgeNode.objects.values_list("text", flat=True))
    assert "The firewall blocks inbound traffic on port 22." in texts
    warnings = ParseArtifact.objects.get(document=document).warnings
    assert f"image not fetched (document-supplied URLs are never fetched): {stub_url}" in warnings
    assert len(warnings) == len(HOSTILE) + 1


def test_many_images_are_counted_after_the_first_ten(socket_guard: list[object]) -> None:
    urls = [f"http://10.0.0.{i}/a.png" for i in range(25)]
    report = parse_with_report(markdown_doc(urls), "text/markdown")
    assert len(report.warnings) == 11
    assert report.warnings[-1] == "15 more images were not fetched"
    assert socket_guard == []


def test_inline_images_are_part_of_the_document() -> None:
    page = b'<p>x</p><img src="data:image/png;base64,iVBORw0KGgo="><img src="cid:logo@x">'
    assert parse_with_report(page, "text/html").warnings == []
