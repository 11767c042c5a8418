"""Which Tesseract language data can read a page: the script Tesseract's OSD finds on it
(``--psm 0``, language data ``osd``, Debian ``tesseract-ocr-osd``), the languages that write
that script, and the languages installed (``tesseract --list-langs``).

Pure Python (no Django); used by :mod:`ingestion.parsing.ocr`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

#: Tesseract language codes (``<lang>.traineddata``) that write each OSD script, most common
#: first. Debian packages them as ``tesseract-ocr-<code with _ as ->``.
SCRIPT_LANGUAGES: dict[str, tuple[str, ...]] = {
    "Latin": ("eng", "deu", "fra", "spa", "ita", "por", "nld", "pol"),
    "Han": ("chi_sim", "chi_tra", "jpn"),
    "Korean": ("kor",),
    "Hangul": ("kor",),
    "Japanese": ("jpn",),
    "Katakana": ("jpn",),
    "Hiragana": ("jpn",),
    "Cyrillic": ("rus", "ukr", "bul", "srp"),
    "Greek": ("ell",),
    "Arabic": ("ara", "fas", "urd"),
    "Hebrew": ("heb",),
    "Devanagari": ("hin", "mar", "nep"),
    "Bengali": ("ben",),
    "Tamil": ("tam",),
    "Telugu": ("tel",),
    "Thai": ("tha",),
    "Armenian": ("hye",),
    "Georgian": ("kat",),
}
#: Readable names for messages.
SCRIPT_NAMES = {"Han": "Chinese (Han)", "Korean": "Korean (Hangul)", "Hangul": "Korean (Hangul)"}

_OSD_SCRIPT = re.compile(r"^Script:\s*(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class ScriptChoice:
    """What OSD found and what to do: ``languages`` to read the page with (``""`` when none
    of the script's languages is installed); ``script`` is ``None`` when OSD could not tell."""

    script: str | None
    languages: str
    wanted: tuple[str, ...] = ()


def installed_languages(command: str) -> frozenset[str]:
    """The language data Tesseract finds (``tesseract --list-langs``; asked each time, only for
    a page the configured languages did not read confidently, so installing data needs no
    restart)."""
    try:
        done = subprocess.run(
            [command, "--list-langs"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    lines = (done.stdout + done.stderr).decode("utf-8", "replace").splitlines()
    return frozenset(
        line.strip() for line in lines if line.strip() and not line.startswith("List of")
    )


def parse_osd(output: str) -> str | None:
    """The ``Script:`` line of Tesseract's ``--psm 0`` output, or ``None``."""
    match = _OSD_SCRIPT.search(output)
    return match.group(1) if match else None


def choose(script: str | None, configured: str, installed: frozenset[str]) -> ScriptChoice:
    """The languages to read a page whose OSD script is ``script``.

    * OSD could not tell, or a configured language writes the script: ``configured``.
    * Else the script's installed languages, the first of them plus ``configured`` (so English
      words beside Chinese are read too): e.g. ``"kor+eng"``.
    * Else ``languages=""`` and ``wanted`` naming the script's languages (none installed).
    """
    if script is None:
        return ScriptChoice(script=None, languages=configured)
    writes = SCRIPT_LANGUAGES.get(script, ())
    if {code for code in configured.split("+") if code} & set(writes):
        return ScriptChoice(script=script, languages=configured)
    available = [code for code in writes if code in installed]
    if not available:
        return ScriptChoice(script=script, languages="", wanted=writes)
    extra = [code for code in configured.split("+") if code and code != available[0]]
    return ScriptChoice(script=script, languages="+".join([available[0], *extra]))


def alternatives(choice: ScriptChoice, installed: frozenset[str]) -> list[str]:
    """Other installed languages of the chosen script (e.g. ``chi_tra`` after ``chi_sim``),
    tried when the first reading is not confident."""
    first = choice.languages.split("+")[0]
    rest = choice.languages.split("+")[1:]
    return [
        "+".join([code, *rest])
        for code in SCRIPT_LANGUAGES.get(choice.script or "", ())
        if code != first and code in installed
    ]


def script_name(script: str | None) -> str:
    return SCRIPT_NAMES.get(script or "", script or "unknown")
