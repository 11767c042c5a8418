"""Decoding of HTML/XHTML bytes: the declaration is weighed against the content.

Order of decisions (:func:`decode_markup`):

1. a Unicode BOM wins (as in the HTML standard);
2. a declared charset - ``<meta charset>``, ``<meta http-equiv="Content-Type"
   content="...; charset=...">`` or an XML declaration's ``encoding`` within the first
   :data:`PRESCAN_BYTES` bytes - mapped to the codec browsers use for that label (WHATWG:
   ``iso-8859-1``/``us-ascii`` are Windows-1252, ``gb2312``/``gbk`` GB18030, ``shift_jis``
   Windows-31J, ``euc-kr`` Windows-949, ...), is used when the bytes decode strictly in it
   and its decoding is not clearly less plausible than the detected one (see
   :func:`~ingestion.parsing.encoding.implausibility`). A wrong declaration (bytes that do
   not decode in it, valid UTF-8 declared as a legacy code page, or a code page whose
   decoding reads as mojibake next to another candidate's) is overruled by detection, with a
   warning naming both;
3. without a usable declaration, the scored detection of the TXT parser
   (:func:`~ingestion.parsing.encoding.decode_text_report`): strict UTF-8, slightly damaged
   UTF-8 (warning), then every legacy candidate scored; a best candidate above the refusal
   threshold is ``undetectable_encoding``, one in the low-confidence band is published with a
   warning.
"""

from __future__ import annotations

import codecs
import re

from .encoding import DecodedText, bom_encoding, decode_text_report, implausibility
from .errors import EncodingError

#: Bytes searched for a charset declaration (the HTML standard's prescan reads 1024; pages
#: with long ``<head>`` comments or scripts put it later, so we read more).
PRESCAN_BYTES = 8192

_META_RE = re.compile(
    rb"""<meta\b[^>]*?\bcharset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE
)
_XML_DECL_RE = re.compile(rb"""^\s*<\?xml\b[^>]*?\bencoding\s*=\s*["']([A-Za-z0-9_.:-]+)""")

#: Labels mapped to the codec a browser decodes them with (WHATWG Encoding Standard).
_WHATWG = {
    "latin-1": "cp1252",
    "iso8859-1": "cp1252",
    "ascii": "cp1252",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
}
_UNICODE = ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-7")


def declared_charset(data: bytes) -> str | None:
    """The Python codec of the charset the document declares (see module docstring), or
    ``None`` when it declares none or an unknown label."""
    head = data[:PRESCAN_BYTES]
    match = _XML_DECL_RE.match(head) or _META_RE.search(head)
    if match is None:
        return None
    try:
        name = codecs.lookup(match.group(1).decode("ascii")).name
    except (LookupError, UnicodeDecodeError):
        return None
    return _WHATWG.get(name, name)


def _non_ascii(text: str) -> int:
    return sum(1 for ch in text if ord(ch) > 0x7F)


def decode_markup(data: bytes) -> DecodedText:
    """Decode HTML/XHTML bytes (see the module docstring for the order of decisions).

    Raises:
        EncodingError: (``undetectable_encoding``) no declaration fits and no encoding's
            decoding is plausible text.
    """
    if bom_encoding(data) is not None:
        return decode_text_report(data)
    declared = declared_charset(data)
    if declared is None or declared in _UNICODE:
        return decode_text_report(data)
    try:
        text = data.decode(declared)
    except UnicodeDecodeError:
        return _overruled(data, declared, "the bytes are not valid")
    if declared == "utf-8" or text.isascii():
        return DecodedText(text, declared)
    try:
        detected = decode_text_report(data)
    except EncodingError:
        return DecodedText(text, declared)
    if detected.encoding == "utf-8" and not detected.warnings:
        # Multi-byte UTF-8 sequences do not occur by chance in legacy text.
        return _note(detected, declared, "the content is UTF-8")
    if codecs.lookup(detected.encoding).name == declared:
        return DecodedText(text, declared)
    own = implausibility(text, declared)
    other = implausibility(detected.text, detected.encoding)
    if own - other > 1 + 0.02 * _non_ascii(text):
        return _note(detected, declared, "its decoding is not plausible text")
    return DecodedText(text, declared)


def _overruled(data: bytes, declared: str, why: str) -> DecodedText:
    return _note(decode_text_report(data), declared, why)


def _note(detected: DecodedText, declared: str, why: str) -> DecodedText:
    note = (
        f"the declared charset {declared} does not fit the document ({why}); "
        f"read as {detected.encoding}"
    )
    return DecodedText(detected.text, detected.encoding, [note, *detected.warnings])
