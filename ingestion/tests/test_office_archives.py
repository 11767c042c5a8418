"""Hostile ZIP entries in office containers (case BC-47): traversal, absolute, drive-letter
and symbolic-link entries are skipped and reported, an expansion bomb is refused before
anything is inflated, and the legitimate content is still indexed. Containers are built by
the tests with python-docx and ``zipfile``."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import docx
import pytest

from ingestion.parsing import ArchiveRejected, parse_with_report, sniff_mime_type
from ingestion.parsing.archive import MAX_RATIO, inspect_zip
from ingestion.tests.test_formats import make_epub, png_bytes
from knowledgefs.testing.fixtures import upload

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
EPUB = "application/epub+zip"
OUTSIDE = [Path("/tmp/kfs_slip.png"), Path("/tmp/kfs_abs.png"), Path("C:\\kfs_win.png")]


def hostile(base: bytes, media: str, *, bomb: bool = False) -> bytes:
    """``base`` with the BC-47 entries added: a traversal under ``media``, an absolute and a
    drive-letter path, a symbolic link to /etc/passwd, and optionally 200 MB of zeros."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(base)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            target.writestr(info, source.read(info.filename))
        target.writestr(f"{media}../../../../tmp/kfs_slip.png", png_bytes("blue"))
        target.writestr("/tmp/kfs_abs.png", png_bytes("blue"))
        target.writestr("C:\\kfs_win.png", png_bytes("blue"))
        target.writestr(f"{media}locked.png", png_bytes("blue"))  # marked encrypted below
        link = zipfile.ZipInfo(f"{media}passwd.png")
        link.create_system = 3
        link.external_attr = 0o120777 << 16
        target.writestr(link, "/etc/passwd")
        if bomb:
            with target.open(f"{media}zeros.bin", "w") as fh:
                for _ in range(200):
                    fh.write(bytes(1024 * 1024))
    return encrypt_flag(out.getvalue(), f"{media}locked.png".encode())


def encrypt_flag(data: bytes, name: bytes) -> bytes:
    """Set the "encrypted" flag (bit 0) of entry ``name`` in its local and central headers
    (zipfile cannot write encrypted entries; the bytes are never decrypted anyway)."""
    out = bytearray(data)
    # (signature, offset of the flags, of the name length, of the name)
    for signature, flags_at, length_at, name_at in (
        (b"PK\x03\x04", 6, 26, 30),
        (b"PK\x01\x02", 8, 28, 46),
    ):
        start = 0
        while (start := out.find(signature, start)) >= 0:
            length = int.from_bytes(out[start + length_at : start + length_at + 2], "little")
            if out[start + name_at : start + name_at + length] == name:
                out[start + flags_at] |= 0x01
            start += 4
    return bytes(out)


def legit_docx() -> bytes:
    document = docx.Document()
    document.add_paragraph("LEGIT-TEXT-47 is still indexed.")
    document.add_picture(io.BytesIO(png_bytes("green", (10, 10))))
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


UNSAFE_WARNINGS = {
    "unsafe archive entry skipped: '{m}../../../../tmp/kfs_slip.png' (path leaves the archive)",
    "unsafe archive entry skipped: '/tmp/kfs_abs.png' (absolute path)",
    "unsafe archive entry skipped: 'C:\\\\kfs_win.png' (drive-letter path)",
    "unsafe archive entry skipped: '{m}passwd.png' (symbolic link)",
    "unsafe archive entry skipped: '{m}locked.png' (encrypted entry)",
}


@pytest.fixture(autouse=True)
def nothing_outside():
    for path in OUTSIDE:
        path.unlink(missing_ok=True)
    yield
    assert not [p for p in OUTSIDE if p.exists()]


def test_bc47_docx_unsafe_entries_skipped_and_reported_text_and_pictures_kept() -> None:
    data = hostile(legit_docx(), "word/media/")
    summary = inspect_zip(data)
    assert {name for name, _ in summary.unsafe} == {
        "word/media/../../../../tmp/kfs_slip.png",
        "/tmp/kfs_abs.png",
        "C:\\kfs_win.png",
        "word/media/passwd.png",
        "word/media/locked.png",
    }
    assert not set(summary.names) & {name for name, _ in summary.unsafe}
    assert sniff_mime_type(data, "report.docx") == DOCX
    report = parse_with_report(data, DOCX)
    assert [e.text for e in report.elements] == ["LEGIT-TEXT-47 is still indexed."]
    assert [(a.name, a.mime_type) for a in report.assets] == [
        ("word/media/image1.png", "image/png")
    ]
    assert set(report.warnings) == {w.format(m="word/media/") for w in UNSAFE_WARNINGS}


def test_bc47_epub_unsafe_entries_skipped_and_reported() -> None:
    data = hostile(make_epub(), "book/img/")
    assert sniff_mime_type(data, "guide.epub") == EPUB
    report = parse_with_report(data, EPUB)
    assert "Spine order puts me first." in [e.text for e in report.elements]
    assert [a.name for a in report.assets] == ["book/img/fig.png"]
    assert set(report.warnings) == {w.format(m="book/img/") for w in UNSAFE_WARNINGS}


@pytest.mark.parametrize(
    ("make", "media", "mime"), [(legit_docx, "word/media/", DOCX), (make_epub, "book/img/", EPUB)]
)
def test_bc47_expansion_bomb_refused_by_ratio_before_inflating(make, media, mime) -> None:
    data = hostile(make(), media, bomb=True)
    assert len(data) < 400_000  # 200 MB of zeros in about 0.2 MB: under the total limit
    started = time.monotonic()
    with pytest.raises(ArchiveRejected) as exc:
        sniff_mime_type(data, "upload" + (".docx" if mime == DOCX else ".epub"))
    assert exc.value.code == "archive_rejected"
    assert f"entry '{media}zeros.bin' expands" in exc.value.message
    assert f"over the limit of {MAX_RATIO}:1" in exc.value.message
    with pytest.raises(ArchiveRejected):
        parse_with_report(data, mime)
    assert time.monotonic() - started < 2  # nothing was inflated


@pytest.mark.django_db
def test_bc47_upload_compiles_with_assets_keyed_by_ordinal(client, space, object_storage):
    from ingestion.models import Document, KnowledgeNode, ParseArtifact
    from knowledgefs.testing.fixtures import compile_all

    response = upload(client, space, "report.docx", hostile(legit_docx(), "word/media/"))
    assert response.status_code == 202, response.content
    compile_all()
    document = Document.objects.get()
    assert document.state == "published"
    assert any("LEGIT-TEXT-47" in n.text for n in KnowledgeNode.objects.filter(document=document))
    artifact = ParseArtifact.objects.get(document_id=document.id)
    (asset,) = artifact.assets
    assert asset["key"].endswith("/0.png") and "kfs" not in asset["key"]
    assert asset["key"].startswith(f"assets/{space.id}/{document.id}/")
    assert len(artifact.warnings) == 5
    stored = sorted(str(p.relative_to(object_storage)) for p in object_storage.rglob("*.png"))
    assert stored == [asset["key"]]

    bomb = upload(client, space, "bomb.docx", hostile(legit_docx(), "word/media/", bomb=True))
    assert bomb.status_code == 400
    assert bomb.json()["code"] == "archive_rejected"
    assert Document.objects.count() == 1
