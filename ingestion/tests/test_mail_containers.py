"""E-mail files in containers: a whole .eml saved as UTF-16/UTF-32, a message behind an mbox
envelope line (Gmail's "download original") and mbox files of several messages (pure Python:
no Django, no database)."""

from __future__ import annotations

import codecs

import pytest

from ingestion.chunking import canonical_text, chunk_elements
from ingestion.parsing import CorruptDocument, parse_with_report, sniff_mime_type

MESSAGE = (
    "From: Anne Dupont <anne@example.com>\r\n"
    "To: bob@example.com\r\n"
    "Subject: Réunion du comité\r\n"
    "Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n"
    "MIME-Version: 1.0\r\n"
    'Content-Type: multipart/alternative; boundary="XYZ"\r\n'
    "\r\n"
    "--XYZ\r\n"
    "Content-Type: text/html; charset=iso-8859-1\r\n"
    "Content-Transfer-Encoding: 8bit\r\n"
    "\r\n"
    "<html><body><p>Rendez-vous au <b>café</b> très tôt.</p></body></html>\r\n"
    "--XYZ--\r\n"
)


def _texts(data: bytes, name: str) -> tuple[str, list[str]]:
    mime = sniff_mime_type(data, name)
    report = parse_with_report(data, mime)
    return mime, [e.text for e in report.elements]


@pytest.mark.parametrize(
    "encoded",
    [
        codecs.BOM_UTF16_LE + MESSAGE.encode("utf-16-le"),
        codecs.BOM_UTF16_BE + MESSAGE.encode("utf-16-be"),
        codecs.BOM_UTF32_LE + MESSAGE.encode("utf-32-le"),
        MESSAGE.encode("utf-16-le"),  # no BOM: recognised by its NUL byte pattern
    ],
    ids=["utf16le-bom", "utf16be-bom", "utf32le-bom", "utf16le-no-bom"],
)
def test_a_utf16_eml_is_decoded_before_mime_parsing(encoded: bytes) -> None:
    mime, texts = _texts(encoded, "meeting.eml")
    assert mime == "message/rfc822"
    assert texts[0] == (
        "From: Anne Dupont <anne@example.com>\nTo: bob@example.com\n"
        "Date: Mon, 01 Jan 2024 10:00:00 +0000\nSubject: Réunion du comité"
    )
    assert texts[1:] == ["Rendez-vous au café très tôt."]
    joined = "\n".join(texts)
    for raw in ("--XYZ", "Content-Type", "<p>", "MIME-Version", "\ufffd"):
        assert raw not in joined


def test_a_utf16_eml_with_a_base64_part_keeps_its_declared_charset() -> None:
    body = codecs.encode("Grüße aus Köln".encode("cp1252"), "base64").decode()
    message = (
        "From: a@example.com\r\nSubject: Gruss\r\nDate: Mon, 1 Jan 2024 10:00:00 +0000\r\n"
        "Content-Type: text/plain; charset=windows-1252\r\n"
        f"Content-Transfer-Encoding: base64\r\n\r\n{body}"
    )
    _, texts = _texts(codecs.BOM_UTF16_LE + message.encode("utf-16-le"), "g.eml")
    assert texts[1:] == ["Grüße aus Köln"]


def test_a_truncated_utf16_eml_is_corrupt_not_raw_source() -> None:
    data = codecs.BOM_UTF16_LE + MESSAGE.encode("utf-16-le")[:-1] + b"\xd8"
    with pytest.raises(CorruptDocument):
        parse_with_report(data, "message/rfc822")


ENVELOPE = "From 1784512345678901234@xxx Mon Jan 01 10:00:05 +0000 2024\n"


def test_a_single_message_with_an_mbox_from_line_is_parsed() -> None:
    data = (ENVELOPE + MESSAGE.replace("\r\n", "\n")).encode("latin-1")
    mime, texts = _texts(data, "original_msg.eml")
    assert mime == "message/rfc822"
    assert texts[0].startswith("From: Anne Dupont <anne@example.com>\n")
    assert texts[1:] == ["Rendez-vous au café très tôt."]
    mime, texts = _texts(data, "original_msg.txt")  # the name does not matter
    assert mime == "message/rfc822"
    assert texts[1:] == ["Rendez-vous au café très tôt."]


def _mail(subject: str, sender: str, body: str) -> str:
    return (
        f"From: {sender}\nTo: team@example.com\nSubject: {subject}\n"
        f"Date: Tue, 2 Jan 2024 09:30:00 +0000\n\n{body}\n"
    )


def test_an_mbox_of_several_messages_gives_one_section_per_message() -> None:
    mbox = (
        "From alice@example.com Tue Jan  2 09:30:00 2024\n"
        + _mail(
            "Budget 2024", "alice@example.com", "The budget is approved.\n>From now on we save."
        )
        + "\nFrom bob@example.com Tue Jan  2 09:45:00 2024\n"
        + _mail("Re: Budget 2024", "bob@example.com", "Thanks!\nFrom the desk of Bob.")
        + "\nFrom carol@example.com Wed Jan  3 08:00:00 2024\n"
        + _mail("", "carol@example.com", "No subject here.")
    ).encode()
    mime = sniff_mime_type(mbox, "export.mbox")
    assert mime == "application/mbox"
    report = parse_with_report(mbox, mime)
    headings = [e.text for e in report.elements if e.type == "heading"]
    date = "Tue, 02 Jan 2024 09:30:00 +0000"
    assert headings == [
        f"Budget 2024 — alice@example.com, {date}",
        f"Re: Budget 2024 — bob@example.com, {date}",
        f"Message 3 — carol@example.com, {date}",
    ]
    body = {e.text: e.section_path for e in report.elements if e.type == "paragraph"}
    assert body["The budget is approved.\nFrom now on we save."] == (headings[0],)
    # A "From " line inside a body that does not follow a blank line starts no message.
    assert body["Thanks!\nFrom the desk of Bob."] == (headings[1],)
    assert body["No subject here."] == (headings[2],)
    canonical, _ = canonical_text(report.elements)
    for chunk in chunk_elements(report.elements):
        assert canonical[chunk.start_offset : chunk.end_offset] == chunk.text


def test_a_utf16_mbox_is_split_too() -> None:
    mbox = (
        "From a@example.com Tue Jan  2 09:30:00 2024\n"
        + _mail("One", "a@example.com", "First body.")
        + "\nFrom b@example.com Tue Jan  2 09:31:00 2024\n"
        + _mail("Two", "b@example.com", "Second body.")
    )
    data = codecs.BOM_UTF16_LE + mbox.encode("utf-16-le")
    assert sniff_mime_type(data, "x.mbox") == "application/mbox"
    texts = [e.text for e in parse_with_report(data, "application/mbox").elements]
    assert "First body." in texts and "Second body." in texts
