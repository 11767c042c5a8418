"""E-mail parsers: EML (stdlib :mod:`email`, ``policy.default``) and Outlook MSG (olefile).

Both produce the same shape: a leading header block, the body (text/plain preferred, else the
HTML body through :func:`~ingestion.parsing.html_parser.parse_html`), one element listing each
attachment, the parsed text of text-like attachments under a section path of the attachment
name, and image attachments as assets.
"""

from __future__ import annotations

import codecs
import datetime as dt
import email
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage, Message
from email.parser import HeaderParser
from typing import Any

import olefile

from .base import MAX_ASSETS, Asset, Element, ParseReport, collapse_ws, image_asset, image_mime_type
from .encoding import decode_text, decode_text_report
from .errors import CorruptDocument, ParseError
from .mail_container import decode_container, is_mbox, message_sections, split_mbox
from .text_parser import split_paragraphs

_CORRUPT_EML = "corrupt or unreadable e-mail message (EML)"
_CORRUPT_MSG = "corrupt or unreadable Outlook message (MSG)"
#: Text-like attachments up to this size are parsed and appended (ours: 5 MiB).
MAX_ATTACHMENT_PARSE_BYTES = 5 * 1024 * 1024
_TEXT_ATTACHMENTS = {
    "text/plain": "txt",
    "text/csv": "csv",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/html": "html",
}
_TEXT_SUFFIXES = {".txt": "txt", ".csv": "csv", ".md": "markdown", ".html": "html", ".htm": "html"}
_HEADER_ORDER = ("From", "To", "Cc", "Date", "Subject")
_ENCODED_CTE = ("base64", "quoted-printable")
#: Attached messages inside attached messages are parsed this deep (ours).
MAX_MESSAGE_DEPTH = 3


@dataclass
class Attachment:
    """One attachment: file name (or ``""``), MIME type and decoded bytes."""

    name: str
    mime_type: str
    data: bytes


@dataclass
class MailContent:
    """What both parsers extract before elements are built."""

    headers: dict[str, str] = field(default_factory=dict)
    plain: str | None = None
    html: str | None = None
    attachments: list[Attachment] = field(default_factory=list)


# -- shared assembly ------------------------------------------------------------------------


def _parse_attachment(att: Attachment, depth: int) -> list[Element]:
    """Elements of a text-like or message attachment (empty for other types or on any parse
    error); an attached (forwarded) message is parsed like a message, nested at most
    :data:`MAX_MESSAGE_DEPTH` deep."""
    from . import csv_parser, html_parser, markdown_parser, text_parser

    if att.mime_type == "message/rfc822":
        if depth >= MAX_MESSAGE_DEPTH or not att.data:
            return []
        try:
            return _parse_eml(att.data, depth + 1).elements
        except ParseError:
            return []

    kind = _TEXT_ATTACHMENTS.get(att.mime_type)
    if kind is None and att.mime_type in ("", "application/octet-stream"):
        suffix = "." + att.name.rsplit(".", 1)[-1].lower() if "." in att.name else ""
        kind = _TEXT_SUFFIXES.get(suffix)
    if kind is None or not att.data or len(att.data) > MAX_ATTACHMENT_PARSE_BYTES:
        return []
    parsers: dict[str, Callable[[bytes], ParseReport | list[Element]]] = {
        "txt": text_parser.parse_text,
        "csv": csv_parser.parse_csv,
        "markdown": markdown_parser.parse_markdown,
        "html": html_parser.parse_html,
    }
    parser = parsers[kind]
    try:
        result = parser(att.data)
    except ParseError:
        return []
    return result.elements if isinstance(result, ParseReport) else result


def _body_elements(content: MailContent) -> list[Element]:
    from .html_parser import parse_html

    if content.plain and content.plain.strip():
        text = content.plain.replace("\r\n", "\n").replace("\r", "\n")
        return [Element(type="paragraph", text=p) for p in split_paragraphs(text)]
    if content.html and content.html.strip():
        # The BOM makes the HTML parser read the (already decoded) text as UTF-8 whatever
        # <meta charset> says.
        elements = parse_html(codecs.BOM_UTF8 + content.html.encode("utf-8", "replace"))
        return [e for e in elements if e.type != "title"]
    return []


def _assemble(content: MailContent, parser: str, depth: int = 0) -> ParseReport:
    out: list[Element] = []
    lines = [f"{k}: {content.headers[k]}" for k in _HEADER_ORDER if content.headers.get(k)]
    if lines:
        out.append(Element(type="paragraph", text="\n".join(lines), metadata={"part": "headers"}))
    out.extend(_body_elements(content))
    assets: list[Asset] = []
    over = 0
    for index, att in enumerate(content.attachments, start=1):
        name = att.name or f"attachment {index}"
        out.append(
            Element(
                type="paragraph",
                text=f"Attachment: {name} ({att.mime_type or 'unknown type'}, "
                f"{len(att.data):,} bytes)",
                metadata={
                    "part": "attachment",
                    "name": name,
                    "mime_type": att.mime_type,
                    "size": len(att.data),
                },
            )
        )
        for element in _parse_attachment(att, depth):
            path = (name, *element.section_path)
            out.append(
                Element(
                    type=element.type,
                    text=element.text,
                    section_path=path,
                    level=element.level,
                    metadata=element.metadata,
                )
            )
        image = image_mime_type(att.data[:64], att.name) if att.data else None
        if image is not None and image != "image/svg+xml":
            if len(assets) >= MAX_ASSETS:
                over += 1
            else:
                assets.append(image_asset(att.data, image, name))
    warnings = [f"{over} images beyond the limit of {MAX_ASSETS} were not kept"] if over else []
    return ParseReport(
        elements=out,
        page_count=None,
        pages_without_text=[],
        parser=parser,
        assets=assets,
        warnings=warnings,
    )


# -- EML ------------------------------------------------------------------------------------


def _part_text(part: Any, transcoded: bool = False) -> str:
    """Decoded text of a text part: its declared charset when the bytes really are in it,
    else detection (an undeclared or wrong charset never turns into U+FFFD mojibake). In a
    message whose file was UTF-16/32 (``transcoded``) an 8-bit part is that file's Unicode
    text, now UTF-8, whatever charset it declares."""
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset()
    if transcoded and part.get("Content-Transfer-Encoding", "").lower() not in _ENCODED_CTE:
        charset = "utf-8"
    if charset:
        try:
            return payload.decode(charset)
        except (LookupError, UnicodeDecodeError):
            pass
    try:
        return decode_text(payload)
    except ParseError:
        return payload.decode("utf-8", "replace")


def _part_bytes(part: Any) -> bytes:
    if part.get_content_maintype() == "message":
        payload = part.get_payload()
        if isinstance(payload, list) and payload:
            return payload[0].as_bytes()
        return b""
    data = part.get_payload(decode=True)
    return data if isinstance(data, bytes) else b""


def _header(msg: Message, name: str) -> str:
    try:
        value = msg.get(name)
    except Exception:  # noqa: BLE001 - a malformed header is dropped, not fatal
        return ""
    return collapse_ws(str(value)) if value is not None else ""


def _eml_content(msg: EmailMessage, transcoded: bool = False) -> MailContent:
    content = MailContent(headers={k: _header(msg, k) for k in _HEADER_ORDER})
    body = msg.get_body(preferencelist=("plain", "html"))
    plain_part = msg.get_body(preferencelist=("plain",))
    html_part = msg.get_body(preferencelist=("html",))
    if plain_part is not None:
        content.plain = _part_text(plain_part, transcoded)
    if html_part is not None:
        content.html = _part_text(html_part, transcoded)
    skip = {id(p) for p in (body, plain_part, html_part) if p is not None}
    for part in msg.walk():
        if id(part) in skip or part is msg:
            continue
        name = collapse_ws(part.get_filename() or "")
        if part.get_content_type() == "message/rfc822":
            # An attached message is one attachment; its own parts are parsed with it.
            skip.update(id(sub) for sub in part.walk())
            inner = part.get_payload()
            # (an item that is not a message has no Subject: _header answered "" for it)
            if not name and isinstance(inner, list) and inner and isinstance(inner[0], Message):
                subject = _header(inner[0], "Subject")
                name = f"{subject}.eml" if subject else ""
        elif part.is_multipart():
            continue
        elif part.get_content_maintype() == "text":
            if part.get_content_disposition() != "attachment" and not name:
                continue  # an alternative body we did not choose
        content.attachments.append(Attachment(name, part.get_content_type(), _part_bytes(part)))
    return content


def parse_eml(data: bytes) -> ParseReport:
    """Parse an RFC 822 message (EML).

    Elements: a ``"paragraph"`` with ``metadata={"part": "headers"}`` holding ``From``,
    ``To``, ``Cc``, ``Date`` and ``Subject`` lines (RFC 2047 encoded words decoded); the body,
    text/plain preferred (split into paragraphs on blank lines), else the HTML body's elements;
    then per attachment a ``"paragraph"`` ``"Attachment: <name> (<type>, <n> bytes)"`` with
    ``metadata={"part": "attachment", "name", "mime_type", "size"}``, followed by the parsed
    elements of a text-like attachment (text, CSV, Markdown, HTML up to 5 MiB) or of an
    attached (forwarded) message (named after its subject when it has no file name) under
    ``section_path`` ``(name, ...)``. Declared charsets are honoured; undeclared or unknown
    ones are detected. Image attachments become ``Asset(kind="image", name=<file name>)``.

    The file is unwrapped first (:mod:`~ingestion.parsing.mail_container`): a UTF-16/32 file
    is decoded, an mbox envelope (``From `` line) removed; an mbox of several messages gives
    one section per message, headed ``"<subject> — <from>, <date>"``.

    Raises:
        CorruptDocument: "corrupt or unreadable e-mail message (EML)".
    """
    data, transcoded = decode_container(data)
    if not is_mbox(data):
        return _parse_eml(data, 0, transcoded)
    messages = split_mbox(data)
    if not messages:
        raise CorruptDocument(_CORRUPT_EML + ": an mbox without messages")
    if len(messages) == 1:
        return _parse_eml(messages[0], 0, transcoded)
    return message_sections([_parse_eml(m, 0, transcoded) for m in messages], "native-email")


def _parse_eml(data: bytes, depth: int, transcoded: bool = False) -> ParseReport:
    try:
        msg = email.message_from_bytes(data, policy=policy.default)
        content = _eml_content(msg, transcoded)
    except ParseError:
        raise
    except Exception as exc:
        raise CorruptDocument(_CORRUPT_EML) from exc
    if not any(content.headers.values()) and not content.plain and not content.html:
        raise CorruptDocument(_CORRUPT_EML + ": no headers and no body")
    return _assemble(content, "native-email", depth)


# -- MSG ------------------------------------------------------------------------------------

_PT_UNICODE = "001F"
_PT_STRING8 = "001E"
_PT_BINARY = "0102"
_PR_SUBJECT = "0037"
_PR_BODY = "1000"
_PR_HTML = "1013"
_PR_SENDER_NAME = "0C1A"
_PR_SENDER_EMAIL = "0C1F"
_PR_SENDER_SMTP = "5D01"
_PR_DISPLAY_TO = "0E04"
_PR_DISPLAY_CC = "0E03"
_PR_HEADERS = "007D"
_PR_DISPLAY_NAME = "3001"
_PR_EMAIL_ADDRESS = "3003"
_PR_SMTP_ADDRESS = "39FE"
_PR_ATTACH_DATA = "3701"
_PR_ATTACH_LONG_NAME = "3707"
_PR_ATTACH_NAME = "3704"
_PR_ATTACH_MIME = "370E"
#: Fixed-size property ids read from ``__properties_version1.0``.
_PID_CODEPAGE = 0x3FFD  # PR_MESSAGE_CODEPAGE (PT_LONG)
_PID_INTERNET_CPID = 0x3FDE  # PR_INTERNET_CPID (PT_LONG)
_PID_SUBMIT_TIME = 0x0039  # PR_CLIENT_SUBMIT_TIME (PT_SYSTIME)
_PID_DELIVERY_TIME = 0x0E06  # PR_MESSAGE_DELIVERY_TIME (PT_SYSTIME)
_FILETIME_EPOCH = dt.datetime(1601, 1, 1, tzinfo=dt.UTC)
_MAX_ATTACHMENTS = 1000


#: Windows code page identifiers whose Python codec is not simply ``cp<number>``, from
#: Microsoft's "Code Page Identifiers" list (learn.microsoft.com/windows/win32/intl/
#: code-page-identifiers). Any other number is tried as ``cp<number>`` (``cp1251``, ``cp932``,
#: ``cp874``, ...).
WINDOWS_CODEPAGES: dict[int, str] = {
    708: "iso8859-6",  # ASMO 708 Arabic
    936: "gbk",
    1200: "utf-16-le",
    1201: "utf-16-be",
    1361: "johab",
    10000: "mac-roman",
    10006: "mac-greek",
    10007: "mac-cyrillic",
    10029: "mac-latin2",
    10079: "mac-iceland",
    10081: "mac-turkish",
    12000: "utf-32-le",
    12001: "utf-32-be",
    20127: "ascii",
    20273: "cp273",
    20866: "koi8-r",
    20932: "euc-jp",
    20936: "gb2312",
    21866: "koi8-u",
    28591: "latin-1",
    28592: "iso8859-2",
    28593: "iso8859-3",
    28594: "iso8859-4",
    28595: "iso8859-5",
    28596: "iso8859-6",
    28597: "iso8859-7",
    28598: "iso8859-8",
    28599: "iso8859-9",
    28603: "iso8859-13",
    28605: "iso8859-15",
    38598: "iso8859-8",  # ISO 8859-8 Hebrew, logical order
    50220: "iso2022-jp",
    50221: "iso2022-jp-ext",  # ISO-2022-JP allowing 1-byte (half-width) kana
    50222: "iso2022-jp-ext",  # the same with SO/SI
    50225: "iso2022-kr",
    51932: "euc-jp",
    51936: "gb2312",  # EUC simplified Chinese
    51949: "euc-kr",
    52936: "hz",
    54936: "gb18030",
    65000: "utf-7",
    65001: "utf-8",
}


def windows_codec(number: int) -> str | None:
    """Python codec of Windows code page ``number`` (:data:`WINDOWS_CODEPAGES`, else
    ``cp<number>`` when Python knows it), or ``None`` when there is none."""
    name = WINDOWS_CODEPAGES.get(number, f"cp{number}")
    try:
        codecs.lookup(name)
    except LookupError:
        return None
    return name


class _Msg:
    """Reads MAPI properties of one storage (the message, a recipient or an attachment).

    ``fallback`` is the code page of 8-bit strings when this storage declares none (a
    recipient or attachment inherits the message's); the message itself, declaring none,
    detects it from its own 8-bit strings like a text file (:func:`decode_text_report`).
    """

    def __init__(
        self, ole: olefile.OleFileIO, prefix: str, header_bytes: int, fallback: str | None = None
    ) -> None:
        self.ole = ole
        self.prefix = prefix
        self.fixed = self._fixed_properties(header_bytes)
        self.codepage = self._codepage() or fallback or self._detected_codepage()

    def _stream(self, name: str) -> bytes | None:
        path = f"{self.prefix}{name}"
        if not self.ole.exists(path):
            return None
        return self.ole.openstream(path).read()

    def _fixed_properties(self, header_bytes: int) -> dict[int, tuple[int, bytes]]:
        raw = self._stream("__properties_version1.0") or b""
        out: dict[int, tuple[int, bytes]] = {}
        for offset in range(header_bytes, len(raw) - 15, 16):
            tag, _flags, value = struct.unpack_from("<II8s", raw, offset)
            out[tag >> 16] = (tag & 0xFFFF, value)
        return out

    def long(self, pid: int) -> int | None:
        entry = self.fixed.get(pid)
        if entry is None or entry[0] != 0x0003:
            return None
        return int(struct.unpack_from("<i", entry[1])[0])

    def time(self, pid: int) -> dt.datetime | None:
        entry = self.fixed.get(pid)
        if entry is None or entry[0] != 0x0040:
            return None
        ticks = struct.unpack_from("<Q", entry[1])[0]
        try:
            return _FILETIME_EPOCH + dt.timedelta(microseconds=ticks // 10)
        except OverflowError:
            return None

    def _codepage(self) -> str | None:
        for pid in (_PID_INTERNET_CPID, _PID_CODEPAGE):
            number = self.long(pid)
            if number and number > 0:
                name = windows_codec(number)
                if name is not None:
                    return name
        return None

    def _detected_codepage(self) -> str:
        """Codec of this storage's 8-bit strings, detected over all of them together; UTF-8
        (decoded with replacement) when detection refuses them."""
        parent = self.prefix.rstrip("/").split("/") if self.prefix else []
        names = sorted(
            entry[-1]
            for entry in self.ole.listdir(streams=True, storages=False)
            if entry[:-1] == parent
            and entry[-1].startswith("__substg1.0_")
            and entry[-1].endswith(_PT_STRING8)
        )
        blob = b"\n".join(self._stream(n) or b"" for n in names[:_MAX_ATTACHMENTS])
        if not blob.strip(b"\x00\n"):
            return "utf-8"
        try:
            return decode_text_report(blob.replace(b"\x00", b"")).encoding
        except ParseError:
            return "utf-8"

    def string(self, prop: str) -> str:
        """A string property: Unicode (``001F``) first, else 8-bit (``001E``) in the
        message's declared code page."""
        raw = self._stream(f"__substg1.0_{prop}{_PT_UNICODE}")
        if raw is not None:
            return raw.decode("utf-16-le", "replace").rstrip("\x00")
        raw = self._stream(f"__substg1.0_{prop}{_PT_STRING8}")
        if raw is not None:
            return raw.decode(self.codepage, "replace").rstrip("\x00")
        return ""

    def binary(self, prop: str) -> bytes | None:
        return self._stream(f"__substg1.0_{prop}{_PT_BINARY}")


def _children(ole: olefile.OleFileIO, prefix: str) -> list[str]:
    names = {entry[0] for entry in ole.listdir(streams=True, storages=True) if entry}
    return sorted(n for n in names if n.startswith(prefix))[:_MAX_ATTACHMENTS]


def _msg_recipients(ole: olefile.OleFileIO, fallback: str) -> list[str]:
    out = []
    for storage in _children(ole, "__recip_version1.0_#"):
        recipient = _Msg(ole, f"{storage}/", 8, fallback)
        name = collapse_ws(recipient.string(_PR_DISPLAY_NAME))
        address = collapse_ws(
            recipient.string(_PR_SMTP_ADDRESS) or recipient.string(_PR_EMAIL_ADDRESS)
        )
        if name and address and name != address:
            out.append(f"{name} <{address}>")
        elif name or address:
            out.append(name or address)
    return out


def _msg_date(message: _Msg) -> str:
    transport = message.string(_PR_HEADERS)
    if transport:
        date = HeaderParser(policy=policy.default).parsestr(transport).get("Date")
        if date:
            return collapse_ws(str(date))
    stamp = message.time(_PID_SUBMIT_TIME) or message.time(_PID_DELIVERY_TIME)
    return stamp.strftime("%a, %d %b %Y %H:%M:%S +0000") if stamp else ""


def _msg_attachments(ole: olefile.OleFileIO, fallback: str) -> list[Attachment]:
    out = []
    for storage in _children(ole, "__attach_version1.0_#"):
        att = _Msg(ole, f"{storage}/", 8, fallback)
        name = collapse_ws(
            att.string(_PR_ATTACH_LONG_NAME)
            or att.string(_PR_ATTACH_NAME)
            or att.string(_PR_DISPLAY_NAME)
        )
        data = att.binary(_PR_ATTACH_DATA) or b""
        mime = collapse_ws(att.string(_PR_ATTACH_MIME)).lower()
        if not mime:
            mime = "message/rfc822" if not data else "application/octet-stream"
            mime = image_mime_type(data[:64], name) or mime
        out.append(Attachment(name, mime, data))
    return out


def _msg_content(ole: olefile.OleFileIO) -> MailContent:
    message = _Msg(ole, "", 32)
    sender_name = collapse_ws(message.string(_PR_SENDER_NAME))
    sender = collapse_ws(message.string(_PR_SENDER_SMTP) or message.string(_PR_SENDER_EMAIL))
    if sender_name and sender and sender_name != sender:
        sender = f"{sender_name} <{sender}>"
    recipients = _msg_recipients(ole, message.codepage)
    content = MailContent(
        headers={
            "From": sender or sender_name,
            "To": ", ".join(recipients) or collapse_ws(message.string(_PR_DISPLAY_TO)),
            "Cc": collapse_ws(message.string(_PR_DISPLAY_CC)) if not recipients else "",
            "Date": _msg_date(message),
            "Subject": collapse_ws(message.string(_PR_SUBJECT)),
        }
    )
    content.plain = message.string(_PR_BODY) or None
    html = message.binary(_PR_HTML)
    if html:
        try:
            content.html = decode_text(html)
        except ParseError:
            content.html = html.decode(message.codepage, "replace")
    else:
        content.html = message.string(_PR_HTML) or None
    content.attachments = _msg_attachments(ole, message.codepage)
    return content


def parse_msg(data: bytes) -> ParseReport:
    """Parse an Outlook MSG (OLE2 compound file) into the same elements as :func:`parse_eml`.

    MAPI properties are read from the ``__substg1.0_<id><type>`` streams: subject ``0037``,
    plain body ``1000`` (preferred), HTML body ``1013``, sender ``0C1A``/``0C1F``/``5D01``,
    recipients from ``__recip_version1.0_#*`` (``3001`` name, ``39FE``/``3003`` address,
    else display-to ``0E04``), date from the transport headers ``007D`` or the submit time
    ``0039``. Unicode (``001F``) strings are UTF-16LE; 8-bit (``001E``) ones are decoded with
    the declared code page (``PR_INTERNET_CPID``/``PR_MESSAGE_CODEPAGE``, mapped by
    :func:`windows_codec`); without one, the code page is detected from the message's 8-bit
    strings as for a text file (recipients and attachments inherit the message's).
    Attachments (``__attach_version1.0_#*``): name ``3707``/``3704``, MIME type ``370E``,
    bytes ``3701``; an embedded message is listed, not parsed.

    Raises:
        CorruptDocument: "corrupt or unreadable Outlook message (MSG)".
    """
    try:
        with olefile.OleFileIO(io.BytesIO(data)) as ole:
            if not ole.exists("__properties_version1.0"):
                raise CorruptDocument(_CORRUPT_MSG + ": no message properties")
            content = _msg_content(ole)
    except ParseError:
        raise
    except Exception as exc:
        raise CorruptDocument(_CORRUPT_MSG) from exc
    return _assemble(content, "olefile-msg")
