"""Content-first MIME type detection for uploads."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import PurePath

import filetype

from .base import EmptyDocument, UnsupportedType
from .encoding import bom_encoding, guess_bomless_utf16

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
_OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_OLE2_BY_EXT = {
    ".doc": "application/msword",
    ".xls": "application/vnd.ms-excel",
    ".ppt": "application/vnd.ms-powerpoint",
    ".msg": "application/vnd.ms-outlook",
}
_ZIP_PREFIXES = {
    "xl/": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt/": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
_TEXT_EXT = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".mdown": "text/markdown",
    ".mkd": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/csv",
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "text/html",
}
_PLAIN_EXT = {".txt", ".text", ".log", ".md", ".markdown", ".csv", ".tsv", ".html", ".htm"}
_LEADING_NOISE_RE = re.compile(r"^(?:\s+|<\?xml[^>]*\?>|<!--.*?-->)+", re.DOTALL)
_HTML_START_RE = re.compile(r"^<(?:!doctype\s+html|html|head|body)\b", re.IGNORECASE)
_HTML_MARKER_RE = re.compile(r"<(?:!doctype\s+html|html|body)\b", re.IGNORECASE)
_SVG_START_RE = re.compile(r"^<(?:!doctype\s+svg|svg)\b", re.IGNORECASE)
_HEADER_LINE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*:[ \t]")
_EMAIL_HEADERS = {
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "received",
    "return-path",
    "content-type",
    "delivered-to",
    "reply-to",
    "cc",
}
_HEAD_BYTES = 4096
_BINARY_BYTES_RE = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")


def _read_member(zf: zipfile.ZipFile, name: str, limit: int) -> str:
    try:
        with zf.open(name) as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except Exception:  # damaged member (zlib.error, CRC error, ...): decide from names
        return ""


def _zip_type(data: bytes, ext: str) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = zf.namelist()
            content_types = ""
            if "[Content_Types].xml" in names:
                content_types = _read_member(zf, "[Content_Types].xml", 65536)
            mimetype = _read_member(zf, "mimetype", 200).strip() if "mimetype" in names else ""
    except Exception as exc:  # not a readable ZIP at all
        if ext == ".docx":  # let the DOCX parser report it as a corrupt DOCX
            return DOCX
        raise UnsupportedType("application/zip") from exc
    if "ms-word.document.macroEnabled" in content_types:
        raise UnsupportedType("application/vnd.ms-word.document.macroEnabled.12")
    if "wordprocessingml.template" in content_types:
        raise UnsupportedType(
            "application/vnd.openxmlformats-officedocument.wordprocessingml.template"
        )
    if "wordprocessingml.document.main+xml" in content_types:
        return DOCX
    if not content_types and "word/document.xml" in names:  # content types unreadable
        return DOCX
    for prefix, mime in _ZIP_PREFIXES.items():
        if any(n.startswith(prefix) for n in names):
            raise UnsupportedType(mime)
    if mimetype:
        raise UnsupportedType(mimetype)
    raise UnsupportedType("application/zip")


def _head_text(data: bytes) -> str:
    head = data[:_HEAD_BYTES]
    bom = bom_encoding(head)
    if bom is not None:
        return head[bom[1] :].decode(bom[0], "ignore")
    enc16 = guess_bomless_utf16(head) if b"\x00" in head else None
    if enc16 is not None:
        return head.decode(enc16, "ignore")
    return head.decode("latin-1")


def looks_like_html(data: bytes) -> bool:
    """True when the content starts (after BOM, XML declaration, comments and whitespace) with
    ``<!doctype html``, ``<html``, ``<head`` or ``<body``, or starts with a tag and has one of
    those markers within the first 4 KiB."""
    text = _LEADING_NOISE_RE.sub("", _head_text(data).lstrip("\ufeff"), count=1)
    if _HTML_START_RE.match(text):
        return True
    return text.startswith("<") and bool(_HTML_MARKER_RE.search(text))


def looks_like_email(head: str) -> bool:
    """True when the text opens with an RFC 822 header block naming at least three of the
    usual message headers (``From``, ``To``, ``Subject``, ``Date``, ``Message-ID``,
    ``MIME-Version``, ``Received``, …)."""
    names = set()
    for line in head.splitlines():
        if not line.strip():
            break
        if line[:1] in " \t":  # folded continuation of the previous header
            continue
        if not _HEADER_LINE_RE.match(line):
            return False
        names.add(line.split(":", 1)[0].lower())
    return len(names & _EMAIL_HEADERS) >= 3


def sniff_mime_type(data: bytes, filename: str) -> str:
    """Detect the MIME type of an upload, content first.

    Binary formats are recognised by content only: PDF magic (``%PDF-`` within the first
    KiB), a ZIP container holding a WordprocessingML document (DOCX). HTML is recognised by
    markers at the start (``<!doctype html``, ``<html``, ``<head``, ``<body``). The file
    name's extension only chooses among text flavours: ``.md``/``.markdown`` ->
    ``text/markdown``, ``.csv``/``.tsv`` -> ``text/csv``, ``.html``/``.htm`` (content starting
    with ``<``) -> ``text/html``, anything else -> ``text/plain``. A ``.pdf`` name on
    non-PDF bytes is therefore not a PDF.

    Returns:
        One of the keys of :data:`SUPPORTED_MIME_TYPES`.

    Raises:
        EmptyDocument: (code ``"empty_file"``) when ``data`` is empty.
        UnsupportedType: for a binary type that is recognised but not parsed (XLSX, PPTX,
            EPUB, images, legacy Office/OLE2, other ZIPs...) or unrecognised binary data
            under a non-text extension; ``mime_type`` names the detected type.
    """
    if not data:
        raise EmptyDocument()
    ext = PurePath(filename or "").suffix.lower()
    if b"%PDF-" in data[:1024]:
        return PDF
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_type(data, ext)
    if data.startswith(_OLE2_MAGIC):
        raise UnsupportedType(_OLE2_BY_EXT.get(ext, "application/x-ole-storage"))
    if data[:64].lstrip().startswith(b"{\\rtf"):
        raise UnsupportedType("application/rtf")
    if bom_encoding(data) is None and _BINARY_BYTES_RE.search(data[:8192]):
        # Only content with control bytes can be a binary format: magic numbers of some
        # formats ("BM", "ID3", "MZ", ...) are also the start of ordinary text.
        kind = filetype.guess(data[:8192])
        if kind is not None and not kind.mime.startswith("text/"):
            raise UnsupportedType(kind.mime)
    head = _head_text(data).lstrip("\ufeff")
    if _SVG_START_RE.match(_LEADING_NOISE_RE.sub("", head, count=1)):
        raise UnsupportedType("image/svg+xml")
    if ext in (".eml", ".mbox") or looks_like_email(head):
        # RFC 822 messages carry base64 attachments; indexing them as text would index noise.
        raise UnsupportedType("message/rfc822")
    if looks_like_html(data):
        return "text/html"
    mime = _TEXT_EXT.get(ext, "text/plain")
    if mime == "text/html" and not _head_text(data).lstrip("\ufeff \t\r\n").startswith("<"):
        mime = "text/plain"
    if (
        b"\x00" in data[:_HEAD_BYTES]
        and bom_encoding(data) is None
        and ext not in _PLAIN_EXT
        and guess_bomless_utf16(data) is None
    ):
        # NULs without a UTF-16 pattern under a non-text name: some binary we don't know.
        raise UnsupportedType("application/octet-stream")
    return mime
