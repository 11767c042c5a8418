"""XML documents: text content with element paths, sniffing, and safe parsing (no external
entity, DTD or network access; entity bombs refused; malformed XML is corrupt_document).
Pure Python: no Django, no database."""

from __future__ import annotations

import socket

import pytest

from ingestion.chunking import canonical_text, chunk_elements
from ingestion.parsing import CorruptDocument, UnsupportedType, parse_with_report, sniff_mime_type

CATALOG = b"""<?xml version="1.0" encoding="UTF-8"?>
<!-- a catalog -->
<catalog xmlns:x="urn:example:x">
  <book id="bk101"><author>Gambardella, Matthew</author>
    <title>XML Developer's Guide</title><price>44.95</price></book>
  <book id="bk102"><author>Ralls, Kim</author><title>Midnight Rain</title>
    <description>A former architect battles <b>corporate</b> zombies.</description>
    <reviews><review stars="4">Great read</review><review stars="2">Meh</review></reviews>
  </book>
  <?render fast?>
  <x:note>Prices in USD</x:note>
</catalog>"""


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every socket connection attempted during the test is recorded and refused."""
    attempts: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network access refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_xml_is_indexed_as_text_with_element_paths() -> None:
    mime = sniff_mime_type(CATALOG, "catalog.xml")
    assert mime == "application/xml"
    report = parse_with_report(CATALOG, mime)
    assert report.parser == "lxml-xml"
    assert [(e.type, e.text, e.section_path) for e in report.elements] == [
        ("heading", "catalog/book[1]", ("catalog/book[1]",)),
        (
            "paragraph",
            "@id: bk101\nauthor: Gambardella, Matthew\ntitle: XML Developer's Guide\nprice: 44.95",
            ("catalog/book[1]",),
        ),
        ("heading", "catalog/book[2]", ("catalog/book[2]",)),
        (
            "paragraph",
            "@id: bk102\nauthor: Ralls, Kim\ntitle: Midnight Rain\n"
            "description: A former architect battles corporate zombies.",
            ("catalog/book[2]",),
        ),
        ("heading", "catalog/book[2]/reviews", ("catalog/book[2]", "catalog/book[2]/reviews")),
        (
            "paragraph",
            "review @stars=4: Great read\nreview @stars=2: Meh",
            ("catalog/book[2]", "catalog/book[2]/reviews"),
        ),
        ("paragraph", "note: Prices in USD", ("catalog/note",)),
    ]
    assert report.elements[3].metadata["paths"] == [
        "catalog/book[2]/@id",
        "catalog/book[2]/author",
        "catalog/book[2]/title",
        "catalog/book[2]/description",
    ]
    joined = "\n".join(e.text for e in report.elements)
    for markup in ("<", ">", "a catalog", "render fast", "urn:example"):
        assert markup not in joined
    canonical, _ = canonical_text(report.elements)
    for chunk in chunk_elements(report.elements):
        assert canonical[chunk.start_offset : chunk.end_offset] == chunk.text


@pytest.mark.parametrize(
    ("data", "name", "expected"),
    [
        (CATALOG, "catalog.txt", "application/xml"),  # the declaration decides, not the name
        (b"<catalog><book>x</book></catalog>", "catalog.xml", "application/xml"),
        (b"<!-- c --><catalog/>", "c.xml", "application/xml"),
        (b"<b>bold</b> is a tag", "note.txt", "text/plain"),
        (b'<?xml version="1.0"?><html><body><p>x</p></body></html>', "p.xml", "text/html"),
        ("\ufeff<?xml version='1.0'?><a>é</a>".encode("utf-16"), "a.bin", "application/xml"),
    ],
)
def test_xml_sniffing(data: bytes, name: str, expected: str) -> None:
    assert sniff_mime_type(data, name) == expected


def test_svg_stays_refused() -> None:
    with pytest.raises(UnsupportedType):
        sniff_mime_type(b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>', "a.xml")


def test_a_utf16_and_a_latin1_declared_document_decode() -> None:
    utf16 = '<?xml version="1.0" encoding="UTF-16"?><r><t>Grüße</t><t>日本語</t></r>'.encode(
        "utf-16"
    )
    assert [e.text for e in parse_with_report(utf16, "application/xml").elements] == [
        "t: Grüße",
        "t: 日本語",
    ]
    latin = '<?xml version="1.0" encoding="ISO-8859-1"?><r>Crème brûlée</r>'.encode("latin-1")
    assert [e.text for e in parse_with_report(latin, "text/xml").elements] == ["Crème brûlée"]


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<lolz>&lol9;</lolz>"""


def test_billion_laughs_is_refused_without_expansion(no_sockets: list[object]) -> None:
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(BILLION_LAUGHS, sniff_mime_type(BILLION_LAUGHS, "lol.xml"))
    assert exc.value.code == "corrupt_document"
    assert "entity declarations are not accepted" in exc.value.message
    assert no_sockets == []


@pytest.mark.parametrize(
    "doctype",
    [
        '<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>',
        '<!DOCTYPE r [<!ENTITY xxe SYSTEM "http://127.0.0.1:9/secret">]>',
        '<!DOCTYPE r [<!ENTITY % pe SYSTEM "http://169.254.169.254/latest/meta-data/"> %pe;]>',
    ],
    ids=["file", "http", "parameter-entity"],
)
def test_external_entities_are_never_read(doctype: str, no_sockets: list[object]) -> None:
    data = f'<?xml version="1.0"?>{doctype}<r><t>before &xxe; after</t></r>'.encode()
    with pytest.raises(CorruptDocument):
        parse_with_report(data, "application/xml")
    assert no_sockets == []


def test_an_external_dtd_is_not_fetched(no_sockets: list[object]) -> None:
    data = (
        b'<?xml version="1.0"?><!DOCTYPE r SYSTEM "http://127.0.0.1:9/r.dtd">'
        b"<r><t>plain text</t></r>"
    )
    assert [e.text for e in parse_with_report(data, "application/xml").elements] == [
        "t: plain text"
    ]
    assert no_sockets == []


@pytest.mark.parametrize(
    "data",
    [b"<r><t>unclosed</r>", b'<?xml version="1.0"?>', b"<r>&undefined;</r>", b"<a></a><b></b>"],
)
def test_malformed_xml_is_corrupt_document(data: bytes) -> None:
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(data, "application/xml")
    assert exc.value.code == "corrupt_document"
    assert exc.value.message.startswith("corrupt or unreadable XML")
