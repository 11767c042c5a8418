"""XML parser: the text content of a generic XML document, with element paths as sections.

Parsing is safe by construction (lxml with ``resolve_entities=False``, ``no_network=True``,
``load_dtd=False``, ``huge_tree=False``): no external entity, DTD or XInclude is ever read,
from disk or network. A document declaring entities (the billion-laughs family, external
entities) is refused before the parser reads it (any ``<!ENTITY`` in the file). Malformed
XML is ``corrupt_document``.

Layout: every top-level element (a child of the root) is a section headed by its path
(``catalog/book[2]``, the position counted among same-named siblings, as in XPath, and only
when there are several); an element with element children (a *record*) renders its
attributes and its leaf children as ``name: value`` lines (``@id: bk102``,
``title: Midnight Rain``), and its nested records become subsections with their own paths
(``catalog/book[2]/reviews``); the paragraph of a record lists the path of each of its
lines in ``metadata["paths"]`` (``catalog/book[2]/title``). An element with mixed content
(text around child elements, e.g. ``<p>a <b>b</b> c</p>``) is a leaf whose value is all its
text. Namespace prefixes are dropped from names; comments and processing instructions are
not text.
"""

from __future__ import annotations

from collections import Counter

from lxml import etree

from .base import Element, ParseReport, collapse_ws
from .errors import CorruptDocument

_CORRUPT = "corrupt or unreadable XML"
_ENTITIES_REFUSED = f"{_CORRUPT}: entity declarations are not accepted (they are never expanded)"
_ENTITY_MARKERS = tuple(
    "<!ENTITY".encode(codec)
    for codec in ("ascii", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
)
#: Heading levels deeper than this are kept at this level (the path still says where).
_MAX_LEVEL = 6


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


def _name(element: etree._Element) -> str:
    return etree.QName(element).localname


def _children(element: etree._Element) -> list[etree._Element]:
    return [c for c in element if isinstance(c.tag, str)]


def _is_record(element: etree._Element) -> bool:
    """An element with element children and no text of its own between them."""
    children = _children(element)
    if not children:
        return False
    if (element.text or "").strip():
        return False
    return not any((c.tail or "").strip() for c in children)


def _text(element: etree._Element) -> str:
    return collapse_ws("".join(t for t in element.itertext() if isinstance(t, str)))


def _child_paths(element: etree._Element, path: str) -> list[tuple[etree._Element, str]]:
    children = _children(element)
    totals = Counter(_name(c) for c in children)
    seen: Counter[str] = Counter()
    out = []
    for child in children:
        name = _name(child)
        seen[name] += 1
        step = f"{name}[{seen[name]}]" if totals[name] > 1 else name
        out.append((child, f"{path}/{step}"))
    return out


class _Walker:
    def __init__(self) -> None:
        self.out: list[Element] = []

    def record(self, element: etree._Element, path: str, parents: tuple[str, ...]) -> None:
        section = (*parents, path)
        self.out.append(
            Element(
                type="heading",
                text=path,
                section_path=section,
                level=min(len(section), _MAX_LEVEL),
            )
        )
        lines = [
            f"@{etree.QName(k).localname}: {collapse_ws(v)}" for k, v in element.attrib.items()
        ]
        paths = [f"{path}/@{etree.QName(k).localname}" for k in element.attrib]
        nested: list[tuple[etree._Element, str]] = []
        for child, child_path in _child_paths(element, path):
            if _is_record(child):
                nested.append((child, child_path))
                continue
            value = _text(child)
            attrs = "".join(
                f" @{etree.QName(k).localname}={collapse_ws(v)}" for k, v in child.attrib.items()
            )
            if value or attrs:
                lines.append(f"{_name(child)}{attrs}: {value}".rstrip())
                paths.append(child_path)
        if lines:
            self.out.append(
                Element(
                    type="paragraph",
                    text="\n".join(lines),
                    section_path=section,
                    metadata={"paths": paths},
                )
            )
        for child, child_path in nested:
            self.record(child, child_path, section)


def _refuse_entities(tree: etree._ElementTree) -> None:
    dtd = tree.docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise CorruptDocument(_ENTITIES_REFUSED)


def parse_xml(data: bytes) -> ParseReport:
    """Parse an XML document (parser ``"lxml-xml"``), see the module docstring.

    Raises:
        CorruptDocument: malformed XML, or a DTD declaring entities.
    """
    if any(marker in data for marker in _ENTITY_MARKERS):
        # Refused before the parser reads the DTD: nothing is expanded, even partly.
        raise CorruptDocument(_ENTITIES_REFUSED)
    try:
        tree = etree.ElementTree(etree.fromstring(data, _parser()))
    except (etree.XMLSyntaxError, ValueError) as exc:
        detail = str(exc).split("\n", 1)[0][:200]
        raise CorruptDocument(f"{_CORRUPT}: {detail}" if detail else _CORRUPT) from exc
    _refuse_entities(tree)
    root = tree.getroot()
    walker = _Walker()
    name = _name(root)
    if not _is_record(root):
        text = _text(root)
        if text:
            walker.out.append(Element(type="paragraph", text=text, section_path=(name,)))
    else:
        own = [f"@{etree.QName(k).localname}: {collapse_ws(v)}" for k, v in root.attrib.items()]
        if own:
            walker.out.append(Element(type="paragraph", text="\n".join(own), section_path=(name,)))
        for child, path in _child_paths(root, name):
            if _is_record(child):
                walker.record(child, path, ())
            else:
                value = _text(child)
                if value:
                    walker.out.append(
                        Element(
                            type="paragraph", text=f"{_name(child)}: {value}", section_path=(path,)
                        )
                    )
    return ParseReport(
        elements=walker.out, page_count=None, pages_without_text=[], parser="lxml-xml"
    )
