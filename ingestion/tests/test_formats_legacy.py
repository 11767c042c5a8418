"""RTF, legacy Excel (XLS), Word (DOC) and PowerPoint (PPT).

RTF is written by the tests; XLS by xlwt (the writer of the xlrd family); DOC and PPT, which
nothing in Python writes, are the LibreOffice-made samples in ``tests/fixtures/legacy-office``
(see its README). The DOC tests need Debian's ``antiword`` (``make office``) and skip without
it unless ``KFS_REQUIRE_OFFICE`` is set.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import os
import shutil
from pathlib import Path

import pytest
import xlwt

from ingestion.parsing import (
    ContentMismatch,
    CorruptDocument,
    EncryptedDocument,
    ParseError,
    parse_with_report,
    sniff_mime_type,
)
from ingestion.tests.test_formats import png_bytes
from knowledgefs.testing.fixtures import upload

RTF = "application/rtf"
DOC = "application/msword"
XLS = "application/vnd.ms-excel"
PPT = "application/vnd.ms-powerpoint"
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "legacy-office"


def needs_antiword() -> None:
    if shutil.which("antiword") is None:
        if os.environ.get("KFS_REQUIRE_OFFICE") or os.environ.get("CI"):
            pytest.fail("antiword is not installed (make office)")
        pytest.skip("antiword is not installed (make office)")


def report_doc() -> bytes:
    return (FIXTURES / "report.doc").read_bytes()


def deck_ppt() -> bytes:
    return gzip.decompress((FIXTURES / "deck.ppt.gz").read_bytes())


# -- RTF ------------------------------------------------------------------------------------

RTF_1251 = (
    rb"{\rtf1\ansi\ansicpg1251\deff0{\fonttbl{\f0\fnil\fcharset204 Arial;}"
    rb"{\f1\fnil\fcharset0 Times;}}"
    b"\n{\\pard \\'cf\\'f0\\'e8\\'e2\\'e5\\'f2 world\\par}\n"
    rb"\trowd\cellx1000\cellx2000\cellx3000"
    b"\n"
    rb"\intbl Name\cell Qty\cell Note\cell\row"
    b"\n"
    rb"\intbl Bolt\cell\cell spare\cell\row"
    b"\n"
    rb"\intbl Nut\cell 12\cell\cell\row"
    b"\n"
    rb"\pard\f1 Caf\'e9 costs 3 \u8364? now.\par}"
)


def test_rtf_code_pages_unicode_escapes_and_tables_on_the_grid() -> None:
    assert sniff_mime_type(RTF_1251, "letter.rtf") == RTF
    assert sniff_mime_type(RTF_1251, "letter.txt") == RTF  # content, not the name
    report = parse_with_report(RTF_1251, RTF)
    assert [(e.type, e.text) for e in report.elements] == [
        ("paragraph", "Привет world"),
        (
            "table",
            "| Name | Qty | Note |\n| --- | --- | --- |\n| Bolt |  | spare |\n| Nut | 12 |  |",
        ),
        ("paragraph", "Café costs 3 € now."),
    ]
    assert report.elements[1].metadata["rows"] == [["Bolt", "", "spare"], ["Nut", "12", ""]]
    assert report.parser == "striprtf"
    headerless = parse_with_report(
        rb"{\rtf1\ansi\ansicpg1252 \trowd\intbl 10\cell\cell 12\cell 13\cell\row"
        rb"\trowd\intbl 20\cell 21\cell 22\cell 23\cell\row}",
        RTF,
    )
    assert headerless.elements[0].text == "10 |  | 12 | 13\n20 | 21 | 22 | 23"


def test_rtf_bad_input() -> None:
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(b"not rtf at all", RTF)
    assert exc.value.code == "corrupt_document"
    with pytest.raises(ContentMismatch) as exc:
        sniff_mime_type(RTF_1251, "scan.pdf")
    assert exc.value.message == "content mismatch: named .pdf but the content is an RTF document"
    with pytest.raises(ContentMismatch):
        sniff_mime_type(png_bytes(), "letter.rtf")


# -- XLS ------------------------------------------------------------------------------------


def xls_bytes(*, hidden: bool = True) -> bytes:
    book = xlwt.Workbook()
    rates = book.add_sheet("Rates")
    for c, value in enumerate(["Level", "Rate", "Since"]):
        rates.write(0, c, value)
    rates.write_merge(1, 2, 0, 0, "Department level")
    rates.write(1, 1, 480)
    rates.write(2, 1, 350.5)
    date = xlwt.easyxf(num_format_str="YYYY-MM-DD")
    rates.write(1, 2, dt.date(2026, 3, 1), date)
    rates.write(3, 0, "Other")
    rates.write(3, 1, xlwt.Formula("B2+B3"))
    rates.write(4, 0, "Flag")
    rates.write(4, 1, True)
    lookup = book.add_sheet("Lookup")
    lookup.write(0, 0, "Code")
    lookup.write(0, 1, "Label")
    lookup.write(1, 0, "HID-1")
    lookup.write(1, 1, "hidden sheet")
    if hidden:
        lookup.visibility = 1
    buf = io.BytesIO()
    book.save(buf)
    return buf.getvalue()


def test_xls_sheets_merges_dates_and_hidden_sheet() -> None:
    data = xls_bytes()
    assert sniff_mime_type(data, "rates.xls") == XLS
    assert sniff_mime_type(data, "rates.bin") == XLS
    report = parse_with_report(data, XLS)
    rates = [e for e in report.elements if e.section_path == ("Rates",) and e.type == "table"]
    assert rates[0].metadata["header"] == ["Level", "Rate", "Since"]
    assert rates[0].text.split("\n") == [
        "| Level | Rate | Since |",
        "| --- | --- | --- |",
        "| Department level | 480 | 2026-03-01 |",
        "| Department level | 350.5 |  |",
        "| Other |  |  |",  # xlwt stores no computed value for a formula: nothing is made up
        "| Flag | TRUE |  |",
    ]
    lookup = [e for e in report.elements if e.section_path == ("Lookup",)]
    assert [e.type for e in lookup] == ["heading", "table"]
    assert all(e.metadata["sheet_state"] == "hidden" for e in lookup)
    assert report.warnings == ["sheet 'Lookup' is hidden; it was indexed and tagged hidden"]


def test_xls_encrypted_corrupt_and_mismatched() -> None:
    data = xls_bytes(hidden=False)
    codepage = b"\x42\x00\x02\x00"  # the CODEPAGE record of the workbook globals
    assert data.count(codepage) == 1
    encrypted = data.replace(codepage, b"\x2f\x00\x02\x00")  # FILEPASS: the workbook is encrypted
    with pytest.raises(EncryptedDocument) as exc:
        parse_with_report(encrypted, XLS)
    assert (exc.value.code, exc.value.message) == (
        "encrypted_document",
        "encrypted XLS, password required",
    )
    assert sniff_mime_type(data[:2000], "rates.xls") == XLS  # damaged: the parser says so
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(data[:2000], XLS)
    assert exc.value.message == "corrupt or unreadable XLS"
    with pytest.raises(ContentMismatch) as exc:
        sniff_mime_type(data, "rates.doc")
    assert "named .doc but the content is a legacy Excel (XLS) workbook" in exc.value.message


# -- DOC ------------------------------------------------------------------------------------


def test_doc_paragraphs_and_table_with_a_blank_cell() -> None:
    needs_antiword()
    data = report_doc()
    assert sniff_mime_type(data, "report.doc") == DOC
    assert sniff_mime_type(data, "report.dat") == DOC
    report = parse_with_report(data, DOC)
    assert [(e.type, e.text) for e in report.elements] == [
        ("paragraph", "Legacy Report"),
        ("paragraph", "DOC-CANARY-61 the legacy Word text. Привет мир."),
        (
            "table",
            "| Region | Q1 | Q2 | Q3 |\n| --- | --- | --- | --- |\n| North | 10 |  | 12 |\n"
            "| South | 30 | 31 | 32 |",
        ),
        ("paragraph", "After the table."),
    ]
    assert report.elements[2].metadata["rows"] == [
        ["North", "10", "", "12"],
        ["South", "30", "31", "32"],
    ]


def test_doc_encrypted_corrupt_and_mismatched() -> None:
    data = bytearray(report_doc())
    fib = data.find(b"\xec\xa5")  # wIdent of the WordDocument stream's file information block
    data[fib + 11] |= 0x01  # FibBase flags: fEncrypted
    with pytest.raises(EncryptedDocument) as exc:
        parse_with_report(bytes(data), DOC)
    assert exc.value.message == "encrypted DOC, password required"
    truncated = report_doc()[:3000]
    assert sniff_mime_type(truncated, "report.doc") == DOC
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(truncated, DOC)
    assert exc.value.message == "corrupt or unreadable DOC"
    with pytest.raises(ContentMismatch):
        sniff_mime_type(report_doc(), "deck.ppt")


# -- PPT ------------------------------------------------------------------------------------


def test_ppt_slides_text_boxes_and_notes() -> None:
    data = deck_ppt()
    assert sniff_mime_type(data, "deck.ppt") == PPT
    report = parse_with_report(data, PPT)
    assert [(e.type, e.text, e.page_number, e.metadata) for e in report.elements] == [
        ("heading", "Legacy Deck", 1, {}),
        ("paragraph", "PPT-CANARY-62 first slide", 1, {}),
        ("paragraph", "NOTE-CANARY-62", 1, {"part": "notes"}),
        ("paragraph", "SECOND-SLIDE-62", 2, {}),
    ]
    assert "Click to edit" not in "\n".join(e.text for e in report.elements)  # masters


def test_ppt_table_keeps_its_columns() -> None:
    data = gzip.decompress((FIXTURES / "table.ppt.gz").read_bytes())
    report = parse_with_report(data, PPT)
    assert [(e.type, e.text, e.page_number) for e in report.elements] == [
        (
            "table",
            "| Region | Q1 | Q2 |\n| --- | --- | --- |\n| North |  | 12 |\n| South | 30 | 31 |",
            1,
        ),
        ("paragraph", "Below the table", 1),
    ]
    assert report.elements[0].metadata["rows"] == [["North", "", "12"], ["South", "30", "31"]]


def test_ppt_encrypted_is_refused() -> None:
    data = deck_ppt()
    title = "Legacy Deck".encode("utf-16-le")
    atom = b"\x00\x00\xa0\x0f" + len(title).to_bytes(4, "little") + title  # TextCharsAtom
    assert data.count(atom) == 1
    # The same record retyped as a CryptSession10Container: what an encrypted deck holds.
    encrypted = data.replace(atom, b"\x0f\x00\x14\x2f" + atom[4:])
    with pytest.raises(EncryptedDocument) as exc:
        parse_with_report(encrypted, PPT)
    assert (exc.value.code, exc.value.message) == (
        "encrypted_document",
        "encrypted PPT, password required",
    )


def test_ppt_corrupt_and_mismatched() -> None:
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(deck_ppt()[:1500], PPT)
    assert exc.value.message == "corrupt or unreadable PPT"
    with pytest.raises(ContentMismatch):
        sniff_mime_type(deck_ppt(), "deck.pptx")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "make", "expected"),
    [
        ("letter.rtf", lambda: RTF_1251, "Café costs 3 € now."),
        ("rates.xls", xls_bytes, "| Department level | 350.5 |  |"),
        ("deck.ppt", deck_ppt, "PPT-CANARY-62"),
        ("report.doc", report_doc, "| North | 10 |  | 12 |"),
    ],
)
def test_legacy_formats_compile_to_published(client, space, name, make, expected):
    from ingestion.models import Document, KnowledgeNode
    from knowledgefs.testing.fixtures import compile_all

    if name.endswith(".doc"):
        needs_antiword()
    response = upload(client, space, name, make())
    assert response.status_code == 202, response.content
    compile_all()
    document = Document.objects.get()
    assert document.state == "published", (document.state, document.error_code)
    assert any(expected in n.text for n in KnowledgeNode.objects.filter(document=document))


def test_rtf_cell_of_several_paragraphs_stays_in_its_cell() -> None:
    rtf = (
        rb"{\rtf1\ansi\ansicpg1252 \pard Before.\par"
        rb"\trowd\cellx1000\cellx2000\pard\intbl Part A\par\pard\intbl Part B\cell"
        rb"\pard\intbl 7\cell\row"
        rb"\trowd\cellx1000\cellx2000\pard\intbl Solo\cell\pard\intbl 8\cell\row"
        rb"\pard After.\par}"
    )
    report = parse_with_report(rtf, RTF)
    assert [(e.type, e.text) for e in report.elements] == [
        ("paragraph", "Before."),
        ("table", "Part A Part B | 7\nSolo | 8"),
        ("paragraph", "After."),
    ]


@pytest.mark.django_db
def test_password_protected_docx_is_refused_at_upload_as_encrypted(client, space):
    from ingestion.models import Document
    from ingestion.tests.test_formats import compound_file

    # [MS-OFFCRYPTO]: the encrypted package inside an OLE2 file (stream contents are opaque)
    protected = compound_file(
        {"EncryptionInfo": b"\x04\x00\x04\x00" + bytes(60), "EncryptedPackage": bytes(200)}
    )
    with pytest.raises(EncryptedDocument) as exc:
        sniff_mime_type(protected, "contract.docx")
    assert exc.value.message == "encrypted Office document, password required"
    response = upload(client, space, "contract.docx", protected)
    assert response.status_code == 400
    assert response.json()["code"] == "encrypted_document"
    assert not Document.objects.exists()


def test_doc_without_antiword_on_the_server_fails_with_a_stable_code(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a server where `make office` never ran
    with pytest.raises(ParseError) as exc:
        parse_with_report(report_doc(), DOC)
    assert exc.value.code == "converter_unavailable"
    assert exc.value.message == (
        "DOC documents cannot be read: antiword is not installed on this server"
    )
