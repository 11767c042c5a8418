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


# -- page furniture ----------------------------------------------------------------------------

SHOP_PAGE = b"""<html><head><title>Shop</title><style>body { color: red }</style>
<script>var tracking = "head script";</script></head><body>
<header><a href="/">Home</a> <a href="/shop">Shop</a> Sign in</header>
<nav><ul><li>Products</li><li>About us</li></ul></nav>
<div role="navigation">Breadcrumb &gt; Tools</div>
<div role="banner">Free shipping this week</div>
<main><article><header><h1>Cordless drill</h1><p>By Ann, 2 May</p></header>
<p>The drill has two speeds.<script>document.write("inline script")</script></p>
<pre>x = 1<script>alert("script in pre")</script><style>.c {}</style></pre>
<template><p>template text</p></template><noscript>Enable JavaScript</noscript>
<table><tr><th>Part</th><th>Qty</th></tr><tr><td>Bit<style>td{}</style></td><td>4</td></tr>
<tr><td>Case<noscript>no js</noscript></td><td>1</td></tr></table>
<footer>Article footer: 3 comments</footer></article></main>
<footer>Copyright 2024 ACME. Privacy. Terms.</footer>
<div role="contentinfo">Contact us</div></body></html>"""


def test_navigation_page_header_and_footer_are_not_body_text() -> None:
    report = parse_with_report(SHOP_PAGE, sniff_mime_type(SHOP_PAGE, "shop.html"))
    assert [(e.type, e.text) for e in report.elements] == [
        ("title", "Shop"),
        ("heading", "Cordless drill"),  # an article's own header is content
        ("paragraph", "By Ann, 2 May"),
        ("paragraph", "The drill has two speeds."),
        ("code", "x = 1"),
        ("table", "| Part | Qty |\n| --- | --- |\n| Bit | 4 |\n| Case | 1 |"),
        ("paragraph", "Article footer: 3 comments"),
    ]
    joined = "\n".join(e.text for e in report.elements)
    for furniture in ("Home", "Products", "Breadcrumb", "shipping", "Copyright", "Contact"):
        assert furniture not in joined
    for hidden in ("script", "template", "Enable", "no js", "color", "td{}", ".c"):
        assert hidden not in joined


def test_a_page_that_is_all_header_keeps_it() -> None:
    page = b"<html><body><header><h1>Notice</h1><p>The office is closed.</p></header></body></html>"
    assert [e.text for e in parse_with_report(page, "text/html").elements] == [
        "Notice",
        "The office is closed.",
    ]
    nav_only = b"<html><body><nav><a href='/a'>Annual report 2024</a></nav></body></html>"
    assert [e.text for e in parse_with_report(nav_only, "text/html").elements] == [
        "Annual report 2024"
    ]


def test_blocks_repeated_on_every_page_of_a_book_are_dropped() -> None:
    from ingestion.tests.test_formats import CONTAINER, zip_bytes

    bar = "<p>Field Guide · Previous | Next</p>"
    files = {
        f"book/c{i}.xhtml": (
            '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Guide</title></head>'
            f"<body>{bar}<h1>Chapter {i}</h1><p>Body of chapter {i}.</p>{bar}</body></html>"
        )
        for i in range(1, 5)
    }
    files["book/c5.xhtml"] = (  # a file of nothing but the bar keeps it
        f'<html xmlns="http://www.w3.org/1999/xhtml"><body>{bar}</body></html>'
    )
    items = "".join(
        f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>'
        for i in range(1, 6)
    )
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(1, 6))
    opf = (
        '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
        f"<metadata/><manifest>{items}</manifest><spine>{spine}</spine></package>"
    )
    data = zip_bytes(
        {
            "mimetype": "application/epub+zip",
            "META-INF/container.xml": CONTAINER,
            "book/content.opf": opf,
            **files,
        },
        stored_first="mimetype",
    )
    texts = [e.text for e in parse_with_report(data, "application/epub+zip").elements]
    assert texts == [
        *[t for i in range(1, 5) for t in (f"Chapter {i}", f"Body of chapter {i}.")],
        "Field Guide · Previous | Next",
    ]


def test_a_page_header_holding_the_title_is_content_but_its_navigation_is_not() -> None:
    page = (
        b"<html><body><header><h1>Chapter 1: Arrival</h1><nav>Home | Contents</nav></header>"
        b"<p>The train was late.</p><footer>Page 3</footer></body></html>"
    )
    elements = parse_with_report(page, "text/html").elements
    assert [(e.type, e.text) for e in elements] == [
        ("heading", "Chapter 1: Arrival"),
        ("paragraph", "The train was late."),
    ]
    assert elements[1].section_path == ("Chapter 1: Arrival",)


def test_a_title_equal_to_the_first_heading_is_indexed_once() -> None:
    from ingestion.chunking import canonical_text
    from ingestion.parsing import parse

    page = (
        b"<html><head><title>Depot  Opening Hours</title></head><body>"
        b"<h1>Depot opening hours</h1><p>Open 8-18 on weekdays.</p></body></html>"
    )
    elements = parse(page, "text/html")
    assert [(e.type, e.text) for e in elements][:2] == [
        ("heading", "Depot opening hours"),
        ("paragraph", "Open 8-18 on weekdays."),
    ]
    assert canonical_text(elements)[0].casefold().count("opening hours") == 1
    # A different title is kept.
    other = page.replace(b"<title>Depot  Opening Hours", b"<title>Acme depot")
    assert [e.type for e in parse(other, "text/html")][:2] == ["title", "heading"]
