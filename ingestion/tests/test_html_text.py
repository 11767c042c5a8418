"""HTML text extraction: the encoding of legacy 8-bit pages (declared, undeclared, wrongly
declared) and the page blocks that are not body text (pure Python: no Django, no database)."""

from __future__ import annotations

import pytest

from ingestion.parsing import EncodingError, parse_with_report, sniff_mime_type
from ingestion.parsing.markup_encoding import declared_charset

PAGES = [
    ("cp1252", "C'est très bien. Où est la gare ? À gauche."),  # French
    ("cp1252", "Voilà, un café."),
    ("cp1252", "Grüß Gott"),  # German
    ("cp1252", "Schöne Grüße aus München, die Straße ist lang."),
    ("cp1252", "Mañana, señor. ¿Qué pasó en la reunión?"),  # Spanish
    ("cp1250", "Dobrý den, jak se máte? Děkuji, dobře."),  # Czech
    ("cp1250", "Příliš žluťoučký kůň úpěl ďábelské ódy."),
    ("koi8-r", "Москва - столица России."),  # Russian
    ("koi8-r", "Привет, как дела?"),
]


def _page(body: str, head: str = "") -> str:
    return f"<html><head>{head}<title>Page</title></head><body><p>{body}</p></body></html>"


def _body(data: bytes) -> tuple[str, list[str]]:
    report = parse_with_report(data, sniff_mime_type(data, "page.html"))
    return "\n".join(e.text for e in report.elements if e.type != "title"), report.warnings


@pytest.mark.parametrize(("encoding", "text"), PAGES)
def test_an_undeclared_legacy_page_is_decoded_by_scored_detection(encoding: str, text: str) -> None:
    assert _body(_page(text).encode(encoding)) == (text, [])


@pytest.mark.parametrize(("encoding", "text"), PAGES)
@pytest.mark.parametrize(
    "head",
    [
        '<meta charset="{label}">',
        '<meta http-equiv="Content-Type" content="text/html; charset={label}">',
    ],
    ids=["meta-charset", "http-equiv"],
)
def test_a_declared_charset_is_honoured(encoding: str, text: str, head: str) -> None:
    label = {"cp1252": "windows-1252", "cp1250": "windows-1250", "koi8-r": "KOI8-R"}[encoding]
    assert _body(_page(text, head.format(label=label)).encode(encoding)) == (text, [])


@pytest.mark.parametrize(
    ("encoding", "text", "label", "why"),
    [
        (
            "cp1252",
            "Le café est très bon. Nous étions à la fenêtre où l'on voyait la forêt. "
            "Garçon, une crème brûlée!",
            "iso-8859-2",
            "not plausible",
        ),
        ("cp1252", "Mañana, señor. ¿Qué pasó?", "windows-1250", "not plausible"),
        ("cp1250", "Příliš žluťoučký kůň úpěl ďábelské ódy.", "windows-1252", "not valid"),
        ("koi8-r", "Москва - столица России.", "windows-1251", "not plausible"),
        ("utf-8", "Crème brûlée à la française", "iso-8859-1", "UTF-8"),
    ],
)
def test_a_wrong_declaration_is_overruled_with_a_warning(
    encoding: str, text: str, label: str, why: str
) -> None:
    body, warnings = _body(_page(text, f'<meta charset="{label}">').encode(encoding))
    assert body == text
    (warning,) = warnings
    assert warning.startswith("the declared charset ") and why in warning
    assert warning.endswith(f"read as {encoding}")


def test_latin1_label_means_windows_1252_as_in_browsers() -> None:
    text = "“Quoted” — and 50 €"
    page = _page(text, '<meta charset="ISO-8859-1">').encode("cp1252")
    assert declared_charset(page) == "cp1252"
    assert _body(page) == (text, [])


def test_an_xml_declaration_counts_as_a_declaration() -> None:
    page = ('<?xml version="1.0" encoding="koi8-r"?>' + _page("Привет")).encode("koi8-r")
    assert declared_charset(page) == "koi8-r"
    assert _body(page) == ("Привет", [])


def test_implausible_bytes_are_refused_not_published_as_mojibake() -> None:
    noise = bytes(range(0x80, 0x100)) * 8
    with pytest.raises(EncodingError) as exc:
        parse_with_report(b"<html><body><p>" + noise + b"</p></body></html>", "text/html")
    assert exc.value.code == "undetectable_encoding"


def test_a_low_confidence_decoding_is_published_with_a_warning() -> None:
    # Plausible French, but with stray symbols no French text contains.
    text = (
        "Le café est très bon ¦ à la fenêtre où l'on voyait la forêt ¬ et la mer. "
        "Garçon, une crème brûlée ¬ élevée, s'il vous plaît."
    )
    body, warnings = _body(_page(text).encode("cp1252"))
    assert body == text
    assert warnings == [
        "the encoding was detected as cp1252 with low confidence: some characters may be wrong"
    ]
