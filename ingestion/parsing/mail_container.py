"""What wraps an e-mail message before the MIME parser sees it.

* **The file's own encoding.** A message saved by an editor or a Windows tool as UTF-16 (or
  UTF-32), with a BOM or recognised by its NUL byte pattern, is decoded first and handed to
  the MIME parser as UTF-8: the MIME parser reads bytes as ASCII and would otherwise find no
  header at all and publish the raw source (headers, boundaries, raw HTML) as text.
* **The mbox envelope.** A file in mbox form (Gmail's "download original", a mail client's
  export) starts each message with a ``From <sender> <asctime date>`` line. Messages are
  split at such lines that start the file or follow a blank line (the mboxo/mboxrd
  convention), and one level of ``>`` is removed from body lines escaped as ``>From ``
  (mboxrd). A single message is parsed as an EML; several become one section each
  (:func:`message_sections`).
"""

from __future__ import annotations

import dataclasses
import re

from .base import MAX_ASSETS, Asset, Element, ParseReport
from .encoding import bom_encoding, guess_bomless_utf16
from .errors import CorruptDocument

#: The envelope line of an mbox message: ``From sender@example.com Mon Jan  1 00:00:00 2024``.
MBOX_FROM_RE = re.compile(rb"^From \S+ +(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [^\r\n]*\r?$", re.MULTILINE)
_ESCAPED_FROM_RE = re.compile(rb"^>(>*From )", re.MULTILINE)
_UNICODE_CONTAINERS = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")


def decode_container(data: bytes) -> tuple[bytes, bool]:
    """``(message bytes, transcoded)``: a UTF-16/UTF-32 file (BOM, or UTF-16 without BOM by
    its NUL byte pattern) decoded and re-encoded as UTF-8 (``transcoded`` is then True);
    any other file unchanged.

    Raises:
        CorruptDocument: the file claims UTF-16/32 but does not decode.
    """
    bom = bom_encoding(data)
    encoding, skip = bom if bom is not None else (None, 0)
    if encoding is None and b"\x00" in data[:4096]:
        encoding = guess_bomless_utf16(data)
    if encoding not in _UNICODE_CONTAINERS:
        return data, False
    try:
        text = data[skip:].decode(encoding)
    except UnicodeDecodeError as exc:
        raise CorruptDocument(
            f"corrupt or unreadable e-mail message (EML): not valid {encoding.upper()}"
        ) from exc
    return text.encode("utf-8", "surrogatepass"), True


def is_wrapped(data: bytes) -> bool:
    """True for a message file the MIME parser cannot read as it is: UTF-16/32, or behind an
    mbox envelope line (such a file is parsed natively, never sent raw to a remote parser)."""
    try:
        unwrapped, transcoded = decode_container(data)
    except CorruptDocument:
        return True
    return transcoded or is_mbox(unwrapped)


def is_mbox(data: bytes) -> bool:
    """True when ``data`` (after :func:`decode_container`) starts with an mbox envelope line."""
    return MBOX_FROM_RE.match(data.lstrip(b"\r\n")) is not None


def split_mbox(data: bytes) -> list[bytes]:
    """The messages of an mbox file, without their envelope lines, ``>From`` unescaped.

    Only an envelope line at the start of the file or after a blank line starts a message.
    """
    data = data.lstrip(b"\r\n")
    starts: list[tuple[int, int]] = []  # (envelope line start, message start)
    for match in MBOX_FROM_RE.finditer(data):
        at = match.start()
        if at == 0 or data[:at].endswith((b"\n\n", b"\n\r\n")):
            end = match.end()
            starts.append((at, end + 1 if data[end : end + 1] == b"\n" else end))
    messages = []
    for index, (_, begin) in enumerate(starts):
        stop = starts[index + 1][0] if index + 1 < len(starts) else len(data)
        body = _ESCAPED_FROM_RE.sub(rb"\1", data[begin:stop]).rstrip(b"\r\n") + b"\n"
        if body.strip():
            messages.append(body)
    return messages


def message_heading(report: ParseReport, number: int) -> str:
    """``"<subject> — <from>, <date>"`` from a message's header block (``Message <n>``
    without a subject)."""
    headers: dict[str, str] = {}
    block = next((e for e in report.elements if e.metadata.get("part") == "headers"), None)
    if block is not None:
        for line in block.text.split("\n"):
            name, _, value = line.partition(": ")
            headers.setdefault(name, value.strip())
    subject = headers.get("Subject") or f"Message {number}"
    who = ", ".join(v for v in (headers.get("From"), headers.get("Date")) if v)
    return f"{subject} — {who}" if who else subject


def message_sections(reports: list[ParseReport], parser: str) -> ParseReport:
    """One report of several messages: per message a level-1 heading
    (:func:`message_heading`) and the message's elements under it (``section_path``
    starting with that heading); assets keep pointing at their elements."""
    elements: list[Element] = []
    assets: list[Asset] = []
    warnings: list[str] = []
    over = 0
    for number, report in enumerate(reports, start=1):
        heading = message_heading(report, number)
        elements.append(Element(type="heading", text=heading, section_path=(heading,), level=1))
        offset = len(elements)
        for element in report.elements:
            elements.append(
                Element(
                    type=element.type,
                    text=element.text,
                    section_path=(heading, *element.section_path),
                    level=min(element.level + 1, 6) if element.level else element.level,
                    metadata=element.metadata,
                )
            )
        for asset in report.assets:
            if len(assets) >= MAX_ASSETS:
                over += 1
                continue
            index = asset.element_index
            assets.append(
                asset if index is None else dataclasses.replace(asset, element_index=index + offset)
            )
        warnings.extend(f"message {number}: {w}" for w in report.warnings)
    if over:
        warnings.append(f"{over} images beyond the limit of {MAX_ASSETS} were not kept")
    return ParseReport(
        elements=elements,
        page_count=None,
        pages_without_text=[],
        parser=parser,
        assets=assets,
        warnings=warnings,
    )
