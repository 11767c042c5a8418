"""OpenDocument (ODT, ODS, ODP) packages written by the tests as their XML with ``zipfile``
(the layout LibreOffice writes: a stored ``mimetype`` first, ``META-INF/manifest.xml``,
``content.xml``)."""

from __future__ import annotations

import io
import zipfile

import pytest

from ingestion.parsing import (
    ContentMismatch,
    CorruptDocument,
    EncryptedDocument,
    parse_with_report,
    sniff_mime_type,
)
from ingestion.tests.test_formats import png_bytes
from knowledgefs.testing.fixtures import upload

ODT = "application/vnd.oasis.opendocument.text"
ODS = "application/vnd.oasis.opendocument.spreadsheet"
ODP = "application/vnd.oasis.opendocument.presentation"
NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
    'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0" '
    'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
    'xmlns:xlink="http://www.w3.org/1999/xlink"'
)
MANIFEST = (
    '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
    '<manifest:file-entry manifest:full-path="/" manifest:media-type="{mime}"/>'
    '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml">'
    "{encryption}</manifest:file-entry></manifest:manifest>"
)
ENCRYPTION = (
    '<manifest:encryption-data manifest:checksum-type="SHA1/1K" manifest:checksum="x">'
    '<manifest:algorithm manifest:algorithm-name="Blowfish CFB" '
    'manifest:initialisation-vector="x"/>'
    '<manifest:key-derivation manifest:key-derivation-name="PBKDF2" manifest:salt="x"/>'
    "</manifest:encryption-data>"
)


def package(
    mime: str, body: str, *, styles: str = "", encrypted: bool = False, extra=None
) -> bytes:
    content = (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {NS} office:version="1.3">'
        f"<office:automatic-styles>{styles}</office:automatic-styles>"
        f"<office:body>{body}</office:body></office:document-content>"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("mimetype", mime, compress_type=zipfile.ZIP_STORED)
        manifest = MANIFEST.format(mime=mime, encryption=ENCRYPTION if encrypted else "")
        zf.writestr("META-INF/manifest.xml", manifest)
        zf.writestr("content.xml", content)
        for name, blob in (extra or {}).items():
            zf.writestr(name, blob)
    return buf.getvalue()


def cell(text: str = "", **attrs: str) -> str:
    attributes = "".join(f' table:{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    inner = f"<text:p>{text}</text:p>" if text else ""
    return f"<table:table-cell{attributes}>{inner}</table:table-cell>"


def row(*cells: str, **attrs: str) -> str:
    attributes = "".join(f' table:{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f"<table:table-row{attributes}>{''.join(cells)}</table:table-row>"


ODT_BODY = (
    "<office:text>"
    '<text:h text:outline-level="1">Quarterly Report</text:h>'
    '<text:p>Revenue grew<text:s text:c="2"/>in Q3'
    '<text:note text:note-class="footnote"><text:note-citation>1</text:note-citation>'
    "<text:note-body><text:p>Audited figures.</text:p></text:note-body></text:note>.</text:p>"
    '<text:h text:outline-level="2">Regions</text:h>'
    "<text:list><text:list-item><text:p>North</text:p>"
    "<text:list><text:list-item><text:p>Oslo office</text:p></text:list-item></text:list>"
    "</text:list-item><text:list-item><text:p>South</text:p></text:list-item></text:list>"
    '<table:table table:name="T1"><table:table-column table:number-columns-repeated="4"/>'
    "<table:table-header-rows>"
    + row(cell("Region"), cell("Q1"), cell("Q2"), cell("Q3"))
    + "</table:table-header-rows>"
    + row(
        cell("North", number_rows_spanned="2"),
        cell("10"),
        cell("", number_columns_repeated="1"),
        cell("12"),
    )
    + row(
        "<table:covered-table-cell/>",
        cell("20", number_columns_spanned="2"),
        "<table:covered-table-cell/>",
        cell("22"),
    )
    + row(cell("South"), cell("30"), cell("31"), cell("32"), cell(number_columns_repeated="1020"))
    + row(cell(number_columns_repeated="1024"), number_rows_repeated="1048000")
    + "</table:table>"
    "<text:p>Anchored <draw:frame><draw:text-box><text:p>BOX-TEXT-9</text:p></draw:text-box>"
    "</draw:frame>after the box.</text:p>"
    "</office:text>"
)


def test_odt_headings_lists_notes_tables_on_the_grid_and_text_boxes() -> None:
    data = package(ODT, ODT_BODY, extra={"Pictures/logo.png": png_bytes()})
    assert sniff_mime_type(data, "report.odt") == ODT
    assert sniff_mime_type(data, "report.bin") == ODT  # content, not the name
    report = parse_with_report(data, ODT)
    assert [(e.type, e.text, e.section_path) for e in report.elements] == [
        ("heading", "Quarterly Report", ("Quarterly Report",)),
        ("paragraph", "Revenue grew  in Q3 [Audited figures.].", ("Quarterly Report",)),
        ("heading", "Regions", ("Quarterly Report", "Regions")),
        ("list", "- North\n  - Oslo office\n- South", ("Quarterly Report", "Regions")),
        (
            "table",
            "| Region | Q1 | Q2 | Q3 |\n| --- | --- | --- | --- |\n| North | 10 |  | 12 |\n"
            "| North | 20 |  | 22 |\n| South | 30 | 31 | 32 |",
            ("Quarterly Report", "Regions"),
        ),
        ("paragraph", "Anchored after the box.", ("Quarterly Report", "Regions")),
        ("paragraph", "BOX-TEXT-9", ("Quarterly Report", "Regions")),
    ]
    table = report.elements[4]
    assert table.metadata["rows"] == [
        ["North", "10", "", "12"],
        ["North", "20", "", "22"],
        ["South", "30", "31", "32"],
    ]
    assert [(a.name, a.mime_type) for a in report.assets] == [("Pictures/logo.png", "image/png")]


def test_ods_sheets_formulas_hidden_sheets_and_huge_repeats_stay_small() -> None:
    styles = (
        '<style:style style:name="ta1" style:family="table">'
        '<style:table-properties table:display="true"/></style:style>'
        '<style:style style:name="ta2" style:family="table">'
        '<style:table-properties table:display="false"/></style:style>'
    )
    body = (
        "<office:spreadsheet>"
        '<table:table table:name="Rates" table:style-name="ta1">'
        + row(cell("Level"), cell("Rate"))
        + row(cell("Department level", number_rows_spanned="2"), cell("480"))
        + row("<table:covered-table-cell/>", cell("350"))
        + row(cell("Other"), cell("", formula="of:=SUM([.B2:.B3])"))
        + row(cell(number_columns_repeated="16384"), number_rows_repeated="1048572")
        + "</table:table>"
        '<table:table table:name="Lookup" table:style-name="ta2">'
        + row(cell("Code"), cell("Label"))
        + row(cell("HID-1"), cell("hidden sheet"))
        + "</table:table></office:spreadsheet>"
    )
    data = package(ODS, body, styles=styles)
    assert sniff_mime_type(data, "rates.ods") == ODS
    report = parse_with_report(data, ODS)
    rates = [e for e in report.elements if e.section_path == ("Rates",) and e.type == "table"]
    assert [e.text for e in rates] == [
        "| Level | Rate |\n| --- | --- |\n| Department level | 480 |\n| Department level | 350 |\n"
        "| Other | =SUM([.B2:.B3]) (not calculated) |"
    ]
    lookup = [e for e in report.elements if e.section_path == ("Lookup",)]
    assert [e.type for e in lookup] == ["heading", "table"]
    assert all(e.metadata["sheet_state"] == "hidden" for e in lookup)
    assert "sheet 'Lookup' is hidden; it was indexed and tagged hidden" in report.warnings
    assert any("not calculated" in w for w in report.warnings)


def test_odp_slides_titles_groups_tables_notes_and_hidden_slide() -> None:
    body = (
        "<office:presentation>"
        '<draw:page draw:name="page1">'
        '<draw:frame presentation:class="title"><draw:text-box><text:p>Plan 2027</text:p>'
        "</draw:text-box></draw:frame>"
        "<draw:frame><draw:text-box><text:p>LEFT PANEL</text:p></draw:text-box></draw:frame>"
        "<draw:frame><draw:text-box><text:p>RIGHT PANEL</text:p></draw:text-box></draw:frame>"
        "<draw:g><draw:g><draw:custom-shape><text:p>INNER ONE</text:p></draw:custom-shape>"
        "</draw:g></draw:g>"
        '<draw:connector draw:start-shape="a" draw:end-shape="b"/>'
        "<draw:frame><table:table>"
        + row(cell("COL ALPHA"), cell())
        + row(cell(), cell("VAL BETA"))
        + "</table:table></draw:frame>"
        "<presentation:notes><draw:frame><draw:text-box><text:p>NOTE-CANARY</text:p></draw:text-box></draw:frame></presentation:notes>"
        "</draw:page>"
        '<draw:page draw:name="page2" presentation:visibility="hidden">'
        "<draw:frame><draw:text-box><text:p>HIDDEN-SLIDE-TEXT</text:p></draw:text-box></draw:frame>"
        "</draw:page></office:presentation>"
    )
    data = package(ODP, body)
    assert sniff_mime_type(data, "deck.odp") == ODP
    report = parse_with_report(data, ODP)
    by_text = {e.text: e for e in report.elements}
    assert by_text["Plan 2027"].type == "heading"
    for text in ("LEFT PANEL", "RIGHT PANEL", "INNER ONE"):
        assert (by_text[text].page_number, by_text[text].section_path) == (1, ("Plan 2027",))
    table = next(e for e in report.elements if e.type == "table")
    assert table.metadata["rows"] == [["COL ALPHA", ""], ["", "VAL BETA"]]
    assert by_text["NOTE-CANARY"].metadata == {"part": "notes"}
    hidden = by_text["HIDDEN-SLIDE-TEXT"]
    assert (hidden.page_number, hidden.metadata) == (2, {"hidden_slide": True})
    assert report.warnings == ["slide 2 is hidden; it was indexed and tagged hidden_slide"]


def test_odf_encrypted_corrupt_and_mismatched() -> None:
    encrypted = package(ODT, ODT_BODY, encrypted=True)
    with pytest.raises(EncryptedDocument) as exc:
        parse_with_report(encrypted, ODT)
    assert (exc.value.code, exc.value.message) == (
        "encrypted_document",
        "encrypted ODT, password required",
    )
    broken = package(ODT, "<office:text><text:p>unclosed")
    with pytest.raises(CorruptDocument) as exc:
        parse_with_report(broken, ODT)
    assert exc.value.message == "corrupt or unreadable ODT: content.xml is damaged"
    with pytest.raises(CorruptDocument):
        parse_with_report(package(ODS, "<office:text/>"), ODS)
    with pytest.raises(ContentMismatch) as exc:
        sniff_mime_type(package(ODS, "<office:spreadsheet/>"), "letter.odt")
    assert exc.value.message == (
        "content mismatch: named .odt but the content is an OpenDocument spreadsheet (ODS)"
    )
    with pytest.raises(ContentMismatch):
        sniff_mime_type(png_bytes(), "deck.odp")


@pytest.mark.django_db
def test_odt_upload_compiles_and_is_searchable_text(client, space):
    from ingestion.models import Document, KnowledgeNode
    from knowledgefs.testing.fixtures import compile_all

    response = upload(client, space, "report.odt", package(ODT, ODT_BODY))
    assert response.status_code == 202, response.content
    compile_all()
    document = Document.objects.get()
    assert (document.state, document.mime_type) == ("published", ODT)
    texts = [n.text for n in KnowledgeNode.objects.filter(document=document)]
    assert any("| North | 20 |  | 22 |" in t for t in texts)
