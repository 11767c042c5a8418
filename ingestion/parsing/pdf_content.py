"""What a PDF page's content stream and fonts say before any layout analysis (pypdf objects
only, no pdfminer): which operators it uses (text shown, paths painted, images drawn) and whether
a font has codes that name no character. Used by :mod:`ingestion.parsing.pdf_parser` to skip the
layout pass on text-only pages, to count pages to OCR up front and to avoid pypdf's letters for
unmapped glyphs.
"""

from __future__ import annotations

import re

from pypdf._codecs.adobe_glyphs import adobe_glyphs

# Content-stream operators that draw something besides text: paths painted (stroke, fill,
# rectangles), shadings, XObjects (images, forms) and inline images.
DRAWING_OPS = frozenset({b"re", b"S", b"s", b"f", b"F", b"f*", b"B", b"B*", b"b", b"b*",
                          b"sh", b"Do", b"BI"})  # fmt: skip
# String literals, hex strings and names, removed before the operators are read (a "(S)" shown
# as text is no stroke). A nested parenthesis only ends a literal early: more is read, never less.
_NOT_OPERATORS = re.compile(rb"\((?:\\.|[^\\)])*\)|<[0-9A-Fa-f\s]*>|/[^\s/\[\]()<>{}%]*")
_OPERATOR = re.compile(rb"[A-Za-z'\"*]+")


TEXT_OPS = frozenset({b"Tj", b"TJ", b"'", b'"'})


def operators(page) -> frozenset[bytes] | None:
    """The operators of the page's content stream (``None`` when it cannot be read)."""
    try:
        contents = page.get("/Contents")
        if contents is None:
            return frozenset()
        contents = contents.get_object()
        streams = contents if isinstance(contents, list) else [contents]
        data = b"\n".join(stream.get_object().get_data() for stream in streams)
    except Exception:  # noqa: BLE001 - unknown
        return None
    return frozenset(_OPERATOR.findall(_NOT_OPERATORS.sub(b" ", data)))


def needs_layout(page, ops: frozenset[bytes] | None = None) -> bool:
    """True unless the page's content stream provably draws only text (no path painted, no
    image or form XObject, no inline image) and every font maps to Unicode; such a page needs
    no table or page-image pass, so pdfminer's layout analysis is skipped. Any doubt (an
    unreadable stream) answers True."""
    ops = operators(page) if ops is None else ops
    if ops is None:
        return True
    return bool(ops & DRAWING_OPS) or unmapped_fonts(page)


def unmapped_fonts(page) -> bool:
    """True when a font of the page (or of a form it draws) has codes that name no character:
    a composite (Type0) font with an Identity encoding and no ``/ToUnicode`` (pypdf would print
    its glyph ids as unrelated letters), or a simple font whose ``/Differences`` give a glyph
    name outside the Adobe Glyph List, e.g. ``/C0`` of a math font (pypdf would print the
    name, "/C00.94"). pdfminer honours a ``/ToUnicode`` entry for such a code and marks the
    rest ``(cid:N)``."""
    try:
        return _resources_unmapped(page.get("/Resources"), depth=0)
    except Exception:  # noqa: BLE001
        return False


def _unnamed_glyphs(encoding) -> bool:
    """True when an encoding dictionary's ``/Differences`` name a glyph that is neither in the
    Adobe Glyph List nor a ``uniXXXX``/``uXXXX[XX]`` name."""
    if not hasattr(encoding, "get"):
        return False
    for item in encoding.get("/Differences") or []:
        name = str(item)
        if not name.startswith("/") or name in adobe_glyphs or _UNI_NAME.fullmatch(name):
            continue
        return True
    return False


_UNI_NAME = re.compile(r"/(?:uni(?:[0-9A-F]{4})+|u[0-9A-F]{4,6})(?:\..*)?")


def _resources_unmapped(resources, depth: int) -> bool:
    if resources is None or depth > 3:
        return False
    resources = resources.get_object()
    fonts = resources.get("/Font")
    for font in fonts.get_object().values() if fonts is not None else []:
        font = font.get_object()
        encoding = font.get("/Encoding")
        if font.get("/Subtype") == "/Type0":
            if "/ToUnicode" not in font and str(encoding).startswith("/Identity"):
                return True
        elif encoding is not None and _unnamed_glyphs(encoding.get_object()):
            return True
    xobjects = resources.get("/XObject")
    for xobject in xobjects.get_object().values() if xobjects is not None else []:
        xobject = xobject.get_object()
        if xobject.get("/Subtype") == "/Form" and _resources_unmapped(
            xobject.get("/Resources"), depth + 1
        ):
            return True
    return False
