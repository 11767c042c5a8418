"""Content-first MIME type detection for uploads."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import PurePath

import filetype
import olefile

from .archive import ArchiveRejected, inspect_zip
from .base import image_mime_type
from .encoding import bom_encoding, guess_bomless_utf16
from .errors import (
    ContentMismatch,
    CorruptDocument,
    EmptyDocument,
    EncryptedDocument,
    UnsupportedType,
)
from .mail_container import decode_container, split_mbox

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
EPUB = "application/epub+zip"
EML = "message/rfc822"
MSG = "application/vnd.ms-outlook"
MBOX = "application/mbox"
XML = "application/xml"
ODT = "application/vnd.oasis.opendocument.text"
ODS = "application/vnd.oasis.opendocument.spreadsheet"
ODP = "application/vnd.oasis.opendocument.presentation"
#: OpenDocument packages by their ``mimetype`` entry.
_ODF = {ODT, ODS, ODP}
RTF = "application/rtf"
DOC = "application/msword"
XLS = "application/vnd.ms-excel"
PPT = "application/vnd.ms-powerpoint"
_OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_OLE2_BY_EXT = {
    ".doc": "application/msword",
    ".xls": "application/vnd.ms-excel",
    ".ppt": "application/vnd.ms-powerpoint",
}
_OLE2_BY_STREAM = (
    ("WordDocument", "application/msword"),
    ("Workbook", "application/vnd.ms-excel"),
    ("Book", "application/vnd.ms-excel"),
    ("PowerPoint Document", "application/vnd.ms-powerpoint"),
)
#: Extensions that name one binary format: content of another known format under one of
#: these names is refused (``content_mismatch``) instead of being parsed as what it is.
_BINARY_EXT = {
    ".pdf": PDF,
    ".docx": DOCX,
    ".xlsx": XLSX,
    ".pptx": PPTX,
    ".epub": EPUB,
    ".msg": MSG,
    ".odt": ODT,
    ".ods": ODS,
    ".odp": ODP,
    ".rtf": RTF,
    ".doc": DOC,
    ".xls": XLS,
    ".ppt": PPT,
}
_ZIP_EXT = {
    ".docx": DOCX,
    ".xlsx": XLSX,
    ".pptx": PPTX,
    ".epub": EPUB,
    ".odt": ODT,
    ".ods": ODS,
    ".odp": ODP,
}
#: Content types of the OOXML main parts we parse, and of the macro/template flavours we do not.
_OOXML_MAIN = (
    ("wordprocessingml.document.main+xml", DOCX),
    ("spreadsheetml.sheet.main+xml", XLSX),
    ("presentationml.presentation.main+xml", PPTX),
)
_OOXML_REFUSED = (
    ("ms-word.document.macroEnabled", "application/vnd.ms-word.document.macroEnabled.12"),
    (
        "wordprocessingml.template",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.template",
    ),
    ("ms-excel.sheet.macroEnabled", "application/vnd.ms-excel.sheet.macroEnabled.12"),
    (
        "spreadsheetml.template",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.template",
    ),
    (
        "ms-powerpoint.presentation.macroEnabled",
        "application/vnd.ms-powerpoint.presentation.macroEnabled.12",
    ),
    (
        "presentationml.slideshow",
        "application/vnd.openxmlformats-officedocument.presentationml.slideshow",
    ),
    (
        "presentationml.template",
        "application/vnd.openxmlformats-officedocument.presentationml.template",
    ),
)
_ZIP_NAMES = (
    ("word/document.xml", DOCX),
    ("xl/workbook.xml", XLSX),
    ("ppt/presentation.xml", PPTX),
)
_DESCRIPTIONS = {
    PDF: "a PDF document",
    DOCX: "a Word (DOCX) document",
    XLSX: "an Excel (XLSX) workbook",
    PPTX: "a PowerPoint (PPTX) presentation",
    EPUB: "an EPUB book",
    MSG: "an Outlook (MSG) message",
    EML: "an e-mail message (EML)",
    MBOX: "a mailbox (mbox)",
    XML: "an XML document",
    ODT: "an OpenDocument text (ODT)",
    ODS: "an OpenDocument spreadsheet (ODS)",
    ODP: "an OpenDocument presentation (ODP)",
    "image/png": "a PNG image",
    "image/jpeg": "a JPEG image",
    "image/gif": "a GIF image",
    "image/tiff": "a TIFF image",
    "image/bmp": "a BMP image",
    "image/webp": "a WebP image",
    "image/heic": "a HEIC image",
    "image/heif": "a HEIF image",
    "application/zip": "a ZIP archive",
    "application/msword": "a legacy Word (DOC) document",
    "application/vnd.ms-excel": "a legacy Excel (XLS) workbook",
    "application/vnd.ms-powerpoint": "a legacy PowerPoint (PPT) presentation",
    "application/rtf": "an RTF document",
}
_TEXT_MIMES = {"text/plain", "text/markdown", "text/csv", "text/html"}
_IMAGE_MIMES = {"image/png", "image/jpeg", "image/gif", "image/tiff", "image/bmp", "image/webp"}
_IMAGE_MIMES |= {"image/heic", "image/heif"}
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
_HEADER_LINE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*:")
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
_MBOX_FROM_RE = re.compile(r"^From \S+ +(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ")
_HEAD_BYTES = 4096
#: Mail header blocks (DKIM/ARC signatures, Received chains) often exceed 4 KiB.
_MAIL_HEAD_CHARS = 32768
_BINARY_BYTES_RE = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")


def _read_member(zf: zipfile.ZipFile, name: str, limit: int) -> str:
    try:
        with zf.open(name) as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except Exception:  # damaged member (zlib.error, CRC error, ...): decide from names
        return ""


def _zip_type(data: bytes, ext: str) -> str:
    """Type of a ZIP container from its entries; the central directory is admitted by
    :func:`~ingestion.parsing.archive.inspect_zip` first, so nothing is inflated before."""
    try:
        summary = inspect_zip(data)
    except ArchiveRejected:
        raise
    except Exception as exc:  # noqa: BLE001 - CorruptDocument, or zipfile's NotImplementedError
        if ext in _ZIP_EXT:  # let that format's parser report the damage
            return _ZIP_EXT[ext]
        raise UnsupportedType("application/zip") from exc
    names = set(summary.names)
    content_types = mimetype = ""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            if "[Content_Types].xml" in names:
                content_types = _read_member(zf, "[Content_Types].xml", 65536)
            if "mimetype" in names:
                mimetype = _read_member(zf, "mimetype", 200).strip()
    except Exception as exc:  # noqa: BLE001 - a directory inspect_zip read but zipfile cannot
        if ext in _ZIP_EXT:
            return _ZIP_EXT[ext]
        raise UnsupportedType("application/zip") from exc
    if mimetype == EPUB or mimetype in _ODF:
        return mimetype
    for marker, mime in _OOXML_REFUSED:
        if marker in content_types:
            raise UnsupportedType(mime)
    for marker, mime in _OOXML_MAIN:
        if marker in content_types:
            return mime
    for name, mime in _ZIP_NAMES:
        if name in names:
            return mime
    if "META-INF/container.xml" in names:
        return EPUB
    if mimetype:
        raise UnsupportedType(mimetype)
    raise UnsupportedType("application/zip")


def _ole_type(data: bytes, ext: str) -> str:
    """Type of an OLE2 compound file from its streams: an Outlook message has
    ``__properties_version1.0`` and ``__substg1.0_*`` property streams."""
    try:
        with olefile.OleFileIO(io.BytesIO(data)) as ole:
            entries = ["/".join(e) for e in ole.listdir(streams=True, storages=True)]
    except Exception as exc:  # noqa: BLE001 - olefile raises OSError and assorted others
        if ext == ".msg":  # let the MSG parser report the damage
            return MSG
        if ext in _OLE2_BY_EXT:  # and the legacy Office parsers theirs
            return _OLE2_BY_EXT[ext]
        raise UnsupportedType(_OLE2_BY_EXT.get(ext, "application/x-ole-storage")) from exc
    top = {e for e in entries if "/" not in e}
    if {"EncryptionInfo", "EncryptedPackage"} <= top:
        # [MS-OFFCRYPTO]: a password-protected DOCX/XLSX/PPTX is an OLE2 file around the package
        raise EncryptedDocument("encrypted Office document, password required")
    if "__properties_version1.0" in top and any(e.startswith("__substg1.0_") for e in top):
        return MSG
    for stream, mime in _OLE2_BY_STREAM:
        if stream in top:
            return mime
    raise UnsupportedType(_OLE2_BY_EXT.get(ext, "application/x-ole-storage"))


def _image_type(data: bytes) -> str | None:
    if _BINARY_BYTES_RE.search(data[:64]) is None and not data.startswith(b"\xff\xd8\xff"):
        return None  # every image magic we accept is followed by control bytes
    mime = image_mime_type(data[:64])
    return mime if mime in _IMAGE_MIMES else None


def describe_type(mime_type: str) -> str:
    """Human name of a detected type for messages, e.g. ``"a PNG image"``."""
    return _DESCRIPTIONS.get(mime_type, mime_type)


def _head_text(data: bytes, limit: int = _HEAD_BYTES) -> str:
    head = data[:limit]
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


def looks_like_email(head: str, minimum: int = 3) -> bool:
    """True when the text opens with an RFC 822 header block naming at least ``minimum`` of
    the usual message headers (``From``, ``To``, ``Subject``, ``Date``, ``Message-ID``,
    ``MIME-Version``, ``Received``, …); every line before the blank line must be a header
    or a folded continuation."""
    names = set()
    lines = head.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            break
        if line[:1] in " \t":  # folded continuation of the previous header
            continue
        if not _HEADER_LINE_RE.match(line):
            if number == len(lines):
                break  # the sample may end inside a line
            return False
        names.add(line.split(":", 1)[0].lower())
    return len(names & _EMAIL_HEADERS) >= minimum


_XML_DECL_RE = re.compile(r"^\s*<\?xml\s")
_XML_START_RE = re.compile(r"^<(?:!DOCTYPE\s+)?[A-Za-z_][\w.:-]*")


def _looks_like_xml(head: str, ext: str) -> bool:
    """An XML declaration at the start, or (under a ``.xml`` name) an element or DOCTYPE at
    the start once comments are skipped; HTML and SVG are recognised before."""
    if _XML_DECL_RE.match(head):
        return True
    return ext == ".xml" and bool(_XML_START_RE.match(_LEADING_NOISE_RE.sub("", head, count=1)))


def _detect(data: bytes, ext: str) -> str:
    """Content-first detection (see :func:`sniff_mime_type`), without the mismatch check."""
    if b"%PDF-" in data[:1024]:
        return PDF
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_type(data, ext)
    if data.startswith(_OLE2_MAGIC):
        return _ole_type(data, ext)
    image = _image_type(data)
    if image is not None:
        return image
    if data[:64].lstrip().startswith(b"{\\rtf"):
        return RTF
    if bom_encoding(data) is None and _BINARY_BYTES_RE.search(data[:8192]):
        # Only content with control bytes can be a binary format: magic numbers of some
        # formats ("BM", "ID3", "MZ", ...) are also the start of ordinary text.
        kind = filetype.guess(data[:8192])
        if kind is not None and not kind.mime.startswith("text/"):
            raise UnsupportedType(kind.mime)
    head = _head_text(data).lstrip("\ufeff")
    if _SVG_START_RE.match(_LEADING_NOISE_RE.sub("", head, count=1)):
        raise UnsupportedType("image/svg+xml")
    if _MBOX_FROM_RE.match(head):
        # One message behind an mbox envelope line (Gmail's "download original") is an EML.
        try:
            return MBOX if len(split_mbox(decode_container(data)[0])) > 1 else EML
        except CorruptDocument:  # undecodable UTF-16: the parser reports it
            return EML
    mail_head = _head_text(data, _MAIL_HEAD_CHARS).lstrip("\ufeff")
    if looks_like_email(mail_head, minimum=1 if ext == ".eml" else 3):
        return EML
    if looks_like_html(data):
        return "text/html"
    if _looks_like_xml(head, ext):
        return XML
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


def _mismatch(ext: str, detected: str) -> ContentMismatch:
    return ContentMismatch(
        detected,
        f"content mismatch: named {ext} but the content is {describe_type(detected)}",
    )


def sniff_mime_type(data: bytes, filename: str) -> str:
    """Detect the MIME type of an upload, content first.

    Binary formats are recognised by content only: PDF magic (``%PDF-`` within the first
    KiB); ZIP containers, whose central directory is admitted by
    :func:`~ingestion.parsing.archive.inspect_zip` before any entry is read, by their
    ``mimetype`` entry (EPUB, ODT, ODS, ODP), ``[Content_Types].xml`` main part or entry names
    (DOCX, XLSX, PPTX); OLE2 compound files by their streams (Outlook MSG, legacy DOC, XLS,
    PPT); RTF by ``{\\rtf``; images by magic number (PNG, JPEG, GIF, TIFF, WebP, BMP,
    HEIC/HEIF by the ``ftyp`` brand).
    E-mail (EML) is recognised by an RFC 822 header block (at least three usual headers, one
    under a ``.eml`` name), or by an mbox envelope line (``From sender date``: one message is
    ``message/rfc822``, several ``application/mbox``), XML (``application/xml``) by an XML
    declaration, or an element at the start of a ``.xml`` file, HTML by markers at the start
    (``<!doctype html``, ``<html``, ``<head``, ``<body``). The file name's extension only
    chooses among text flavours: ``.md``/``.markdown`` -> ``text/markdown``,
    ``.csv``/``.tsv`` -> ``text/csv``, ``.html``/``.htm`` (content starting with ``<``) ->
    ``text/html``, anything else -> ``text/plain``; a ``.pdf`` name on plain text is
    therefore text.

    Returns:
        One of the keys of :data:`SUPPORTED_MIME_TYPES`.

    Raises:
        EmptyDocument: (code ``"empty_file"``) when ``data`` is empty.
        EncryptedDocument: (code ``"encrypted_document"``) a password-protected DOCX, XLSX or
            PPTX (an OLE2 file holding ``EncryptionInfo`` and ``EncryptedPackage``).
        ContentMismatch: (code ``"content_mismatch"``) the extension names one binary format
            (``.pdf .docx .xlsx .pptx .epub .msg .odt .ods .odp .rtf .doc .xls .ppt``) but the
            content is another recognised format, e.g. ``"content mismatch: named .pdf but
            the content is a PNG image"``.
        UnsupportedType: for a type that is recognised but not parsed (macro-enabled or
            template Office files, other OLE2 files, SVG, other ZIPs...) or
            unrecognised binary data under a non-text extension; ``mime_type`` names it.
        ArchiveRejected: (code ``"archive_rejected"``) a ZIP container refused by
            :func:`~ingestion.parsing.archive.inspect_zip` (ZIP64, multi-disk, too many
            entries, too large when expanded).
    """
    if not data:
        raise EmptyDocument()
    ext = PurePath(filename or "").suffix.lower()
    expected = _BINARY_EXT.get(ext)
    try:
        detected = _detect(data, ext)
    except ContentMismatch:
        raise
    except UnsupportedType as exc:
        if expected is not None and exc.mime_type in _DESCRIPTIONS:
            raise _mismatch(ext, exc.mime_type) from exc
        raise
    if expected is not None and detected != expected and detected not in _TEXT_MIMES:
        raise _mismatch(ext, detected)
    return detected
