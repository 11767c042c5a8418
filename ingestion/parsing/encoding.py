"""Text decoding with encoding detection, shared by the TXT, Markdown, CSV and e-mail parsers.

Order of decisions (:func:`decode_text_report`):

1. a Unicode BOM (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE), or UTF-16 without BOM recognised from
   its NUL byte pattern;
2. strict UTF-8;
3. *damaged UTF-8*: UTF-8 in which a tiny share of bytes is invalid (at most
   :data:`MAX_STRAY_UTF8_BYTES` bytes and at most :data:`MAX_STRAY_UTF8_RATIO` of the
   document) is decoded with each invalid byte replaced by U+FFFD (kept in the text so a
   reader of a citation sees where the damage is) and a warning is reported. This holds for
   ASCII with a few stray high bytes too: a short legacy text with one accent in a long
   ASCII file is read the same way (the warning says so); longer legacy texts have more than
   0.1 % non-ASCII bytes and go on to step 4;
4. legacy code pages: every candidate of :data:`LEGACY_CANDIDATES` (plus charset-normalizer's
   proposals) that decodes strictly is scored by :func:`implausibility` - characters no text
   in that encoding's languages would contain (C1 controls, box drawing, half-width katakana,
   lone Hangul jamo, letters of two scripts in one word, case flips inside a word, Latin or
   Cyrillic letters no single language's alphabet explains, kana in a Chinese code page, rare
   ideographs, ...). The lowest score wins; ties go to the earlier candidate in
   :data:`LEGACY_CANDIDATES` (Windows-1252 before Windows-1250, etc.). When even the best
   candidate has more than :data:`MAX_IMPLAUSIBLE_RATIO` implausible characters per non-ASCII
   character the bytes are refused (``undetectable_encoding``) rather than indexed as garbage;
   above :data:`LOW_CONFIDENCE_RATIO` (and 2 points) the text is read with a warning.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

import charset_normalizer

from .base import clean_text
from .cjk_frequency import CHINESE_FREQUENT, JAPANESE_FREQUENT
from .errors import EncodingError

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

#: Most invalid bytes a UTF-8 document may contain and still be read as UTF-8 (with U+FFFD
#: in their place and a warning); beyond it the bytes go to legacy detection.
MAX_STRAY_UTF8_BYTES = 64
#: Largest share of invalid bytes (0.1 %) a UTF-8 document may contain, see above.
MAX_STRAY_UTF8_RATIO = 0.001

#: Legacy code pages tried when the bytes are not UTF-8, in order of preference on a tie
#: (the most widespread Western, Cyrillic and CJK code pages first).
LEGACY_CANDIDATES: tuple[str, ...] = (
    "cp1252",
    "cp1251",
    "koi8-r",
    "gb18030",
    "cp932",
    "euc-jp",
    "big5",
    "cp950",
    "cp949",
    "cp1250",
    "iso8859-15",
    "cp1257",
    "cp1254",
    "cp1253",
    "cp1255",
    "cp1256",
    "koi8-u",
    "iso8859-5",
    "cp866",
)

#: Refusal threshold: implausibility points per non-ASCII character of the best candidate.
MAX_IMPLAUSIBLE_RATIO = 0.2
#: Above this many points per non-ASCII character (at least 2 points, and up to the refusal
#: threshold) the text is published with a warning that its encoding is uncertain.
LOW_CONFIDENCE_RATIO = 0.1

# Code pages whose texts are Chinese (kana are implausible), Japanese (kana expected) and
# Korean (Hangul expected).
_CHINESE = frozenset({"gb18030", "gbk", "gb2312", "big5", "cp950", "big5hkscs", "hz"})
_JAPANESE = frozenset({"cp932", "shift_jis", "euc-jp", "euc_jp", "euc_jis_2004", "iso2022_jp"})
_KOREAN = frozenset({"cp949", "euc-kr", "euc_kr", "johab"})

_SCORE_CHARS = 32768  # characters of the decoded text that are scored
#: Implausibility of a letter that only a second language's alphabet explains (a tie-breaker).
SECOND_ALPHABET_COST = 0.1

#: Letters beyond ASCII of the alphabets of languages written in legacy Latin and Cyrillic
#: code pages (lower case). A decoding whose letters no single alphabet explains is suspect.
_ALPHABETS: tuple[frozenset[str], ...] = tuple(
    frozenset(s)
    for s in (
        "àâæçéèêëîïôœùûüÿ",  # French
        "äöüß",  # German
        "áéíñóúü",  # Spanish
        "áâãàçéêíóôõú",  # Portuguese
        "àèéìíîòóùú",  # Italian
        "áéíóúàèëïöüĳ",  # Dutch
        "àçèéíïòóúü",  # Catalan
        "æøåéäöüáóúðþýí",  # Danish, Norwegian, Swedish, Finnish, Icelandic
        "áčďéěíňóřšťúůýž",  # Czech
        "áäčďéíĺľňóôŕšťúýž",  # Slovak
        "ąćęłńóśźż",  # Polish
        "áéíóöőúüű",  # Hungarian
        "ăâîșşțţ",  # Romanian
        "čćđšž",  # Croatian, Serbian (Latin), Bosnian, Slovene
        "çğıöşüâî",  # Turkish
        "ąčęėįšųūž",  # Lithuanian
        "āčēģīķļņšūž",  # Latvian
        "äöõüšž",  # Estonian
        "абвгдежзийклмнопрстуфхцчшщъыьэюяё",  # Russian
        "абвгґдеєжзиіїйклмнопрстуфхцчшщьюя",  # Ukrainian
        "абвгдеёжзійклмнопрстуўфхцчшыьэюя",  # Belarusian
        "абвгдежзийклмнопрстуфхцчшщъьюя",  # Bulgarian
        "абвгдђежзијклљмнњопрстћуфхцџш",  # Serbian
        "абвгдѓежзѕијклљмнњопрстќуфхцџш",  # Macedonian
    )
)
_FIRST_LETTERS = frozenset().union(*_ALPHABETS)

# Symbols (beyond letters, digits and punctuation) that ordinary text contains.
_COMMON_SYMBOLS = frozenset("°½¼¾§©®™±×÷µ¶·€£¥¢№•…")

# One-letter words of French, Italian, Portuguese, Spanish, Russian, Ukrainian and Greek.
_ONE_LETTER_WORDS = frozenset("àèéóòùаввикоосуяієїοηή")
_CYRILLIC_VOWELS = frozenset("аеёиоуыэюяіїєў")

_SCRIPT_OF = {"kana": "cjk", "ideo": "cjk", "rare_ideo": "cjk"}

# Thai letters and signs modern text does not use (KHO KHUAT, KHO KHON, LU, YAMAKKAN,
# FONGMAN, ANGKHANKHU, KHOMUT): in a Thai reading they mark bytes of another language.
_OBSOLETE_THAI = frozenset("\u0e03\u0e05\u0e26\u0e4e\u0e4f\u0e5a\u0e5b")

_SPACED_CJK_RE = re.compile(r"(?<=[\u3040-\u30ff\u4e00-\u9fff]) (?=[\u3040-\u30ff\u4e00-\u9fff])")

_WORD_RE = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class DecodedText:
    """Result of :func:`decode_text_report`.

    Attributes:
        text: the decoded text, LF line endings, no BOM or control characters.
        encoding: Python codec name used (e.g. ``"utf-8"``, ``"cp1252"``, ``"koi8-r"``).
        warnings: short client-safe notes, e.g. ``"3 bytes were not valid UTF-8 and were
            replaced with U+FFFD"``.
    """

    text: str
    encoding: str
    warnings: list[str] = field(default_factory=list)


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
    """Decode text bytes of unknown encoding to ``str``; ``decode_text_report(data).text``.

    Line endings are normalised to ``"\\n"``, control characters and any U+FEFF are removed
    (so the result never starts with a BOM).

    Raises:
        EncodingError: NUL bytes in a file that is not UTF-16/32, bytes that decode only to
            garbage, or no plausible encoding found.
    """
    return decode_text_report(data).text


def decode_text_report(data: bytes) -> DecodedText:
    """Decode text bytes of unknown encoding, reporting the encoding and any warnings.

    See the module docstring for the order of decisions and the thresholds.

    Raises:
        EncodingError: (code ``undetectable_encoding``) NUL bytes in a file that is not
            UTF-16/32, bytes that decode only to garbage, or no encoding whose decoding is
            plausible text.
    """
    bom = bom_encoding(data)
    if bom is not None:
        enc, skip = bom
        try:
            return DecodedText(_finish(data[skip:].decode(enc)), enc)
        except UnicodeDecodeError as exc:
            raise EncodingError() from exc
    if b"\x00" in data:
        enc16 = guess_bomless_utf16(data)
        if enc16 is None:
            raise EncodingError()
        try:
            return DecodedText(_finish(data.decode(enc16)), enc16)
        except UnicodeDecodeError as exc:
            raise EncodingError() from exc
    try:
        return DecodedText(_finish(data.decode("utf-8")), "utf-8")
    except UnicodeDecodeError:
        pass
    damaged = _damaged_utf8(data)
    if damaged is not None:
        text, bad_bytes = damaged
        if bad_bytes == 1:
            note = "1 byte was not valid UTF-8 and was replaced with U+FFFD"
        else:
            note = f"{bad_bytes} bytes were not valid UTF-8 and were replaced with U+FFFD"
        return DecodedText(clean_text(text), "utf-8", [note])
    legacy = _best_legacy(data)
    if legacy is None:
        raise EncodingError()
    enc, text, score = legacy
    non_ascii = sum(1 for ch in text[:_SCORE_CHARS] if ord(ch) > 0x7F)
    if score > MAX_IMPLAUSIBLE_RATIO * max(non_ascii, 1):
        raise EncodingError()
    if score >= 2 and score > LOW_CONFIDENCE_RATIO * non_ascii:
        note = (
            f"the encoding was detected as {enc} with low confidence: some characters may be wrong"
        )
        return DecodedText(_finish(text), enc, [note])
    return DecodedText(_finish(text), enc)


def _damaged_utf8(data: bytes) -> tuple[str, int] | None:
    """``(text, invalid_byte_count)`` when ``data`` is UTF-8 with a
    tiny share of invalid bytes (see :data:`MAX_STRAY_UTF8_BYTES`), else ``None``."""
    limit = min(MAX_STRAY_UTF8_BYTES, int(len(data) * MAX_STRAY_UTF8_RATIO))
    parts: list[str] = []
    pos = 0
    bad = 0
    view = memoryview(data)
    size = len(data)
    while pos < size:
        # Windows of 64 KiB: a decoding error copies only its window, not the document.
        end = min(pos + 65536, size)
        try:
            text, used = codecs.utf_8_decode(view[pos:end], "strict", end == size)
        except UnicodeDecodeError as exc:
            parts.append(codecs.utf_8_decode(view[pos : pos + exc.start], "strict", True)[0])
            bad += exc.end - exc.start
            if bad > limit:
                return None
            parts.append("\ufffd" * (exc.end - exc.start))
            pos += exc.end
            continue
        parts.append(text)
        pos += used
    return "".join(parts), bad


def _candidates(data: bytes) -> list[str]:
    names = list(LEGACY_CANDIDATES)
    known = {codecs.lookup(n).name for n in names}
    try:
        matches = charset_normalizer.from_bytes(data[: _SCORE_CHARS * 2])
    except Exception:  # noqa: BLE001 - the detector is one source of candidates among others
        matches = charset_normalizer.CharsetMatches()
    for match in list(matches)[:5]:
        try:
            name = codecs.lookup(match.encoding).name
        except LookupError:
            continue
        if name not in known and not name.startswith(("utf", "mac")):
            known.add(name)
            names.append(name)
    return names


def _best_legacy(data: bytes) -> tuple[str, str, float] | None:
    """``(encoding, text, implausibility)`` of the most plausible strict legacy decoding."""
    best: tuple[float, int, str, str] | None = None
    for rank, enc in enumerate(_candidates(data)):
        try:
            text = data.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
        score = implausibility(text[:_SCORE_CHARS], enc)
        if best is None or (score, rank) < best[:2]:
            best = (score, rank, enc, text)
    if best is None:
        return None
    return best[2], best[3], best[0]


@lru_cache(maxsize=8192)
def _char_class(ch: str) -> str:
    """Class of a non-ASCII character: ``"bad"``, ``"ok"`` (punctuation, common symbol,
    digit, space), ``"kana"``, ``"ideo"``, ``"rare_ideo"``, ``"hangul"`` or ``"L:<SCRIPT>"``."""
    cat = unicodedata.category(ch)
    name = unicodedata.name(ch, "")
    if ch in _OBSOLETE_THAI:
        return "bad"
    if cat[0] == "C" or name.startswith(("HALFWIDTH", "BOX DRAWINGS", "HANGUL LETTER")):
        return "bad"
    if cat[0] in "LM":
        if name.startswith(("HIRAGANA", "KATAKANA")):
            return "kana"
        if name.startswith("CJK"):
            return "ideo" if _common_ideograph(ch) else "rare_ideo"
        if name.startswith("HANGUL SYLLABLE"):
            return "hangul" if _in_ks_x_1001(ch) else "bad"
        if name.startswith("HANGUL"):
            return "hangul"
        return "L:" + name.split(" ", 1)[0]
    if cat[0] in "NZ" or cat[0] == "P" or ch in _COMMON_SYMBOLS:
        return "ok"
    if 0x3000 <= ord(ch) <= 0x303F or 0xFF01 <= ord(ch) <= 0xFF5E:
        return "ok"  # CJK punctuation, full-width forms
    return "bad"


def _in_ks_x_1001(ch: str) -> bool:
    """True for the 2,350 Hangul syllables of KS X 1001 (EUC-KR), which real Korean text
    almost only uses; CP949's other 8,822 come from bytes of other languages."""
    try:
        raw = ch.encode("euc_kr")
    except UnicodeEncodeError:
        return False
    return len(raw) == 2  # Python writes the others as 8-byte KS X 1001 make-up sequences


def _common_ideograph(ch: str) -> bool:
    """True for the frequently used ideographs: level 1 of GB 2312 (lead bytes B0-D7),
    Big5 (A440-C67E) or JIS X 0208 (EUC-JP lead bytes B0-CF)."""
    for enc, low, high in (("gb2312", 0xB0A1, 0xD7FE), ("big5", 0xA440, 0xC67E)):
        try:
            raw = ch.encode(enc)
        except UnicodeEncodeError:
            continue
        if len(raw) == 2 and low <= int.from_bytes(raw, "big") <= high:
            return True
    try:
        raw = ch.encode("euc-jp")
    except UnicodeEncodeError:
        return False
    return len(raw) == 2 and 0xB0 <= raw[0] <= 0xCF


#: Points per ideograph of a GB or Japanese code page reading that is not among its
#: language's frequent characters (:mod:`~ingestion.parsing.cjk_frequency`).
INFREQUENT_IDEOGRAPH_COST = 0.25
_FREQUENT = {
    **{enc: CHINESE_FREQUENT for enc in ("gb18030", "gbk", "gb2312", "hz")},
    **{enc: JAPANESE_FREQUENT for enc in _JAPANESE},
}


def implausibility(text: str, encoding: str) -> float:
    """Points of implausibility of ``text`` as a decoding in ``encoding`` (0 = flawless).

    One point per non-ASCII character that ordinary text does not contain (see
    :func:`_char_class`), per letter of a minority script, per case flip or script mix
    inside a word, per odd word (:func:`_odd_word`), per letter no single alphabet of
    :data:`_ALPHABETS` explains; kana in a Chinese code page, rare ideographs, ideographs
    that are not among the frequent characters of the language of a GB or Japanese code page
    (:data:`INFREQUENT_IDEOGRAPH_COST` each), Hangul syllables outside KS X 1001 (the
    extension rows of CP949/Johab, where Japanese or Chinese bytes land) and spaces between
    ideographs in a Chinese or Japanese code page also count.
    """
    chars = Counter(text)
    counts: dict[str, int] = {}
    for ch, n in chars.items():
        if ord(ch) > 0x7F:
            cls = _char_class(ch)
            counts[cls] = counts.get(cls, 0) + n
    if not counts:
        return 0.0
    score = float(counts.get("bad", 0)) + counts.get("rare_ideo", 0)
    ideo = counts.get("ideo", 0) + counts.get("rare_ideo", 0)
    kana = counts.get("kana", 0)
    enc = codecs.lookup(encoding).name
    if enc in _CHINESE:
        score += kana
    frequent = _FREQUENT.get(enc)
    if frequent is not None and ideo:
        # The wrong one of two CJK readings is a random draw of its code page's ideographs;
        # a real text is mostly made of its language's frequent characters.
        rare_share = sum(
            n for ch, n in chars.items() if "\u4e00" <= ch <= "\u9fff" and ch not in frequent
        )
        score += INFREQUENT_IDEOGRAPH_COST * rare_share
    if enc in _CHINESE or enc in _JAPANESE:
        # Chinese and Japanese put no spaces between words; Korean does.
        score += len(_SPACED_CJK_RE.findall(text))
    groups = {
        "cjk": ideo + kana,
        "hangul": counts.get("hangul", 0),
        **{k: v for k, v in counts.items() if k.startswith("L:")},
    }
    score += _caseless_penalty(chars)
    total_letters = sum(groups.values())
    score += total_letters - max(groups.values())  # letters outside the dominant script
    return score + _word_penalty(text)


def _caseless_penalty(chars: Counter[str]) -> float:
    """Cyrillic or Greek text without a single lower-case letter (a multi-byte CJK text read
    in a single-byte code page), and Latin text whose letters are mostly non-ASCII.
    ``chars`` counts the characters of the text."""
    penalty = 0.0
    upper: Counter[str] = Counter()
    lower: Counter[str] = Counter()
    latin = extra = 0
    for c, n in chars.items():
        if not c.isalpha():
            continue
        cls = "L:LATIN" if c.isascii() else _char_class(c)
        if cls == "L:LATIN":
            latin += n
            extra += 0 if c.isascii() else n
        elif c.isupper():
            upper[cls] += n
        elif c.islower():
            lower[cls] += n
    for script in ("L:CYRILLIC", "L:GREEK"):
        if upper[script] >= 2 and not lower[script]:
            penalty += upper[script] / 2
    if extra > 2 and extra > latin / 2:
        penalty += extra - latin / 2
    return penalty


def _odd_word(word: str) -> int:
    """Non-ASCII one-letter words other than the common ones, and Cyrillic words of three or
    more letters without a vowel."""
    if len(word) == 1:
        return 0 if word.isascii() or word.lower() in _ONE_LETTER_WORDS else 1
    if len(word) >= 3 and _char_class(word[0]) == "L:CYRILLIC":
        if not any(c in _CYRILLIC_VOWELS for c in word.lower()):
            return len(word)
    return 0


def _word_penalty(text: str) -> float:
    """Case flips and script mixes inside words, letters of a word no single alphabet
    explains, and letters of the text the best two alphabets together do not explain."""
    penalty = 0.0
    seen: Counter[str] = Counter()
    for word, n in Counter(_WORD_RE.findall(text)).items():
        if word.isascii():
            continue
        own, letters = _word_score(word)
        penalty += n * own
        for c in letters:
            seen[c] += n
    if seen:
        one, two = _covered(seen)
        # Letters that need a second alphabet cost a little: of two decodings explained
        # equally well, the one a single language explains wins (Czech "děkuji, dobře" in
        # Windows-1250, not "dìkuji, dobøe" in Windows-1252, Italian plus Danish).
        penalty += sum(seen.values()) - two + SECOND_ALPHABET_COST * (two - one)
    return penalty


@lru_cache(maxsize=4096)
def _word_score(word: str) -> tuple[int, str]:
    """``(penalty, alphabet letters)`` of one word with non-ASCII characters: script mixes,
    case flips, odd words and letters no single alphabet of :data:`_ALPHABETS` explains."""
    penalty = 0
    scripts = {
        "ASCII" if c.isascii() else _SCRIPT_OF.get(_char_class(c), _char_class(c)) for c in word
    }
    scripts.discard("ok")
    if "L:LATIN" in scripts:
        scripts.discard("ASCII")
    if len(scripts) > 1:
        penalty += sum(1 for c in word if not c.isascii())
    penalty += _odd_word(word)
    for prev, cur in zip(word, word[1:], strict=False):
        if prev.islower() and cur.isupper() and not (prev.isascii() and cur.isascii()):
            penalty += 1
    letters = "".join(
        c
        for c in word.lower()
        if c in _FIRST_LETTERS or (not c.isascii() and _char_class(c) == "L:LATIN")
    )
    if letters:
        penalty += len(letters) - max(sum(c in a for c in letters) for a in _ALPHABETS)
    return penalty, letters


def _covered(seen: Counter[str]) -> tuple[int, int]:
    """Letter occurrences of ``seen`` that the best alphabet of :data:`_ALPHABETS` explains,
    and that the union of the best two explains (a document may mix two languages)."""

    def count(alpha: frozenset[str]) -> int:
        return sum(n for c, n in seen.items() if c in alpha)

    first = max(_ALPHABETS, key=count)
    return count(first), max(count(first | alpha) for alpha in _ALPHABETS)
