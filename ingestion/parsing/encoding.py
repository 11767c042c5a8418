"""Text decoding with encoding detection, shared by the TXT, Markdown and CSV parsers."""

from __future__ import annotations

import codecs
import re

import charset_normalizer

from .base import EncodingError, clean_text

# Order matters: the UTF-32 LE BOM starts with the UTF-16 LE BOM.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# C0 controls other than TAB/LF/VT/FF/CR, DEL and the C1 range: a decoded text full of
# these is binary data that happened to decode.
_BAD_CHARS_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")
_MAX_BAD_RATIO = 0.02
_MAX_CHAOS = 0.3


def bom_encoding(data: bytes) -> tuple[str, int] | None:
    """Return ``(codec, bom_length)`` when ``data`` starts with a Unicode BOM, else ``None``."""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            return enc, len(bom)
    return None


def guess_bomless_utf16(data: bytes) -> str | None:
    """Guess UTF-16 without BOM from the NUL byte pattern of mostly-ASCII text."""
    sample = data[:8192]
    if len(sample) < 4:
        return None
    even = sample[0::2]
    odd = sample[1::2]
    even_zero = even.count(0) / len(even)
    odd_zero = odd.count(0) / len(odd)
    if odd_zero > 0.5 and even_zero < 0.02:
        return "utf-16-le"
    if even_zero > 0.5 and odd_zero < 0.02:
        return "utf-16-be"
    return None


def _check_plausible(text: str) -> str:
    if text and len(_BAD_CHARS_RE.findall(text)) / len(text) > _MAX_BAD_RATIO:
        raise EncodingError()
    return text


def _finish(text: str) -> str:
    return clean_text(_check_plausible(text).lstrip("\ufeff"))


def decode_text(data: bytes) -> str:
    """Decode text bytes of unknown encoding to ``str``.

    Order: a BOM (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE), then strict UTF-8, then
    charset-normalizer. Line endings are normalised to ``"\\n"``, control characters and any
    U+FEFF are removed (so the result never starts with a BOM).

    Raises:
        EncodingError: NUL bytes in a file that is not UTF-16/32, bytes that decode only to
            garbage, or no plausible encoding found.
    """
    bom = bom_encoding(data)
    if bom is not None:
        enc, skip = bom
        try:
            return _finish(data[skip:].decode(enc))
        except UnicodeDecodeError as exc:
            raise EncodingError() from exc
    if b"\x00" in data:
        enc16 = guess_bomless_utf16(data)
        if enc16 is None:
            raise EncodingError()
        try:
            return _finish(data.decode(enc16))
        except UnicodeDecodeError as exc:
            raise EncodingError() from exc
    try:
        return _finish(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    best = charset_normalizer.from_bytes(data).best()
    if best is None or best.chaos > _MAX_CHAOS:
        raise EncodingError()
    return _finish(str(best))
