"""EPUB parser: the ZIP container read with :mod:`zipfile`, the package document (OPF) with
lxml, and each spine document through our HTML parser, in reading order."""

from __future__ import annotations

import dataclasses
import io
import posixpath
import zipfile
from urllib.parse import unquote

from lxml import etree

from .archive import admit_zip, unsafe_entry_warnings, zip_images
from .base import Element, ParseReport, SectionStack, collapse_ws
from .errors import CorruptDocument, ProtectedDocument
from .html_parser import drop_repeated_blocks, parse_html

_CORRUPT = "corrupt or unreadable EPUB"
_NS = {
    "c": "urn:oasis:names:tc:opendocument:xmlns:container",
    "opf": "http://www.idpf.org/2007/opf",
    "dc": "http://purl.org/dc/elements/1.1/",
    "enc": "http://www.w3.org/2001/04/xmlenc#",
    "ncx": "http://www.daisy.org/z3986/2005/ncx/",
}
#: Font obfuscation (IDPF and Adobe) only scrambles embedded fonts; it is not DRM.
_FONT_OBFUSCATION = {
    "http://www.idpf.org/2008/embedding",
    "http://ns.adobe.com/pdf/enc#RC",
}
_HTML_TYPES = {"application/xhtml+xml", "text/html"}
#: Images an EPUB contributes as assets (ours; books carry many illustrations).
MAX_EPUB_IMAGES = 50
_MAX_SPINE = 5000


def _xml(zf: zipfile.ZipFile, name: str) -> etree._Element:
    """Parse an XML entry without entity expansion or network access."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=False)
    try:
        return etree.fromstring(zf.read(name), parser)
    except KeyError as exc:
        raise CorruptDocument(f"{_CORRUPT}: {name} is missing") from exc
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise CorruptDocument(f"{_CORRUPT}: {name} is not well-formed XML") from exc


def _check_drm(zf: zipfile.ZipFile, names: set[str]) -> None:
    """Refuse a book whose content files are encrypted (anything beyond font obfuscation)."""
    if "META-INF/encryption.xml" not in names:
        return
    root = _xml(zf, "META-INF/encryption.xml")
    for data in root.iterfind(".//enc:EncryptedData", _NS):
        method = data.find("enc:EncryptionMethod", _NS)
        algorithm = method.get("Algorithm", "") if method is not None else ""
        if algorithm not in _FONT_OBFUSCATION:
            raise ProtectedDocument(
                "DRM-protected EPUB: its content is encrypted (META-INF/encryption.xml) "
                "and cannot be read"
            )


def _package_path(zf: zipfile.ZipFile) -> str:
    root = _xml(zf, "META-INF/container.xml")
    rootfile = root.find(".//c:rootfile", _NS)
    path = rootfile.get("full-path") if rootfile is not None else None
    if not path:
        raise CorruptDocument(f"{_CORRUPT}: no package document in META-INF/container.xml")
    return unquote(path)


def _resolve(base_dir: str, href: str) -> str:
    return posixpath.normpath(posixpath.join(base_dir, unquote(href.split("#", 1)[0])))


def _toc_labels(zf: zipfile.ZipFile, names: set[str], ncx_path: str | None) -> dict[str, str]:
    """First NCX label per content document (file path -> label); ``{}`` without an NCX."""
    if not ncx_path or ncx_path not in names:
        return {}
    try:
        root = _xml(zf, ncx_path)
    except CorruptDocument:
        return {}
    labels: dict[str, str] = {}
    base_dir = posixpath.dirname(ncx_path)
    for point in root.iterfind(".//ncx:navPoint", _NS):
        text = point.findtext("ncx:navLabel/ncx:text", default="", namespaces=_NS)
        content = point.find("ncx:content", _NS)
        if content is not None and content.get("src") and collapse_ws(text):
            labels.setdefault(_resolve(base_dir, content.get("src")), collapse_ws(text))
    return labels


def _chapter(elements: list[Element], label: str) -> list[Element]:
    """Elements of one spine document without its ``<title>`` (it repeats the book title in
    every file); elements outside any heading take the document's table-of-contents label as
    their section path."""
    out = []
    for element in elements:
        if element.type == "title":
            continue
        if not element.section_path and label:
            element = dataclasses.replace(element, section_path=(label,))
        out.append(element)
    return out


def parse_epub(data: bytes) -> ParseReport:
    """Parse an EPUB 2/3 book in spine order.

    ``META-INF/container.xml`` names the package document (OPF); its ``spine`` gives the
    reading order of the manifest's XHTML documents, each parsed by
    :func:`~ingestion.parsing.html_parser.parse_html` (headings give the section paths, and
    the heading stack continues from one document to the next, since books are split
    mid-chapter; text outside any heading takes the document's NCX table-of-contents label).
    Navigation, page headers and footers are dropped like in any HTML page, and so are short
    blocks repeated in most files of the book (running headers, "previous | next" bars).
    The book title (``dc:title``) comes first as a ``"title"`` element. Manifest images
    become ``Asset(kind="image")``, at most :data:`MAX_EPUB_IMAGES` (a warning counts the
    rest).

    Raises:
        ArchiveRejected: the container is refused by the ZIP inspection.
        ProtectedDocument: ``META-INF/encryption.xml`` encrypts content (code
            ``drm_protected``); font obfuscation alone is accepted.
        CorruptDocument: "corrupt or unreadable EPUB" (with what is missing or malformed).
    """
    summary = admit_zip(data, "EPUB")
    names = set(summary.names)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise CorruptDocument(_CORRUPT) from exc
    with zf:
        _check_drm(zf, names)
        opf_path = _package_path(zf)
        opf = _xml(zf, opf_path)
        base_dir = posixpath.dirname(opf_path)
        manifest: dict[str, tuple[str, str]] = {}
        for item in opf.iterfind(".//opf:manifest/opf:item", _NS):
            if item.get("id") and item.get("href"):
                manifest[item.get("id")] = (
                    _resolve(base_dir, item.get("href")),
                    (item.get("media-type") or "").lower(),
                )
        spine = opf.find(".//opf:spine", _NS)
        if spine is None:
            raise CorruptDocument(f"{_CORRUPT}: the package document has no spine")
        ncx = manifest.get(spine.get("toc") or "", ("", ""))[0] or next(
            (p for p, t in manifest.values() if t == "application/x-dtbncx+xml"), None
        )
        labels = _toc_labels(zf, names, ncx)
        out: list[Element] = []
        title = collapse_ws(opf.findtext(".//dc:title", default="", namespaces=_NS))
        if title:
            out.append(Element(type="title", text=title))
        sections = SectionStack()  # headings continue across files (chapters are split)
        chapters: list[list[Element]] = []
        for itemref in list(spine.iterfind("opf:itemref", _NS))[:_MAX_SPINE]:
            path, media_type = manifest.get(itemref.get("idref") or "", ("", ""))
            if media_type not in _HTML_TYPES or path not in names:
                continue
            chapters.append(_chapter(parse_html(zf.read(path), sections), labels.get(path, "")))
        for chapter in drop_repeated_blocks(chapters):
            out.extend(chapter)
        images = [p for p, t in manifest.values() if t.startswith("image/") and p in names]
    assets, over = zip_images(data, images, cap=MAX_EPUB_IMAGES)
    warnings = unsafe_entry_warnings(summary)
    if over:
        warnings.append(f"{over} images beyond the limit of {MAX_EPUB_IMAGES} were not kept")
    return ParseReport(
        elements=out,
        page_count=None,
        pages_without_text=[],
        parser="native-epub",
        assets=assets,
        warnings=warnings,
    )
