"""Document-supplied URLs are never fetched.

Markdown and HTML images (``![alt](http://...)``, ``<img src>``, ``srcset``), DOCX pictures
linked to an external target instead of embedded, and hyperlinks stay references: no parser,
and nothing in compilation, opens a connection for a URL a document names (cloud metadata
addresses, loopback services, ``file://`` paths and redirects to them included, case BC-48).
The text around them is indexed as usual; each image that is not embedded in the file is
recorded as a parse warning so that a reader knows the picture is not part of the document.
Should remote images ever be fetched, it must be through an SSRF-safe fetcher (http/https only,
public addresses only, every redirect hop checked again) - there is none today.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: URLs listed one by one in the warnings of one document; the rest are counted.
MAX_LISTED = 10
_MAX_URL_CHARS = 200

_MD_IMAGE_RE = re.compile(r"!\[[^\]\n]*\]\(\s*<?([^)\s>]+)")
_MD_REFERENCE_RE = re.compile(r"^ {0,3}\[([^\]\n]+)\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_MD_REF_IMAGE_RE = re.compile(r"!\[([^\]\n]*)\](?:\[([^\]\n]*)\])?")
_HTML_IMG_RE = re.compile(r"""<img\b[^>]*?\bsrc\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
#: Schemes that are data inside the document or a part of it, not a location to fetch.
_INLINE = ("data:", "cid:", "#")


def markdown_image_urls(text: str) -> list[str]:
    """Image targets of Markdown text: inline ``![alt](url)``, reference images and raw
    ``<img src>``, in order of appearance."""
    references = {m.group(1).strip().lower(): m.group(2) for m in _MD_REFERENCE_RE.finditer(text)}
    urls = [m.group(1) for m in _MD_IMAGE_RE.finditer(text)]
    for match in _MD_REF_IMAGE_RE.finditer(text):
        label = (match.group(2) or match.group(1)).strip().lower()
        if label in references:
            urls.append(references[label])
    urls.extend(m.group(1) for m in _HTML_IMG_RE.finditer(text))
    return urls


def unfetched_image_warnings(urls: Iterable[str]) -> list[str]:
    """One warning per distinct image URL that was not fetched (data/cid/fragment references
    are part of the document and not listed), at most :data:`MAX_LISTED`, then a count."""
    distinct: list[str] = []
    for url in urls:
        url = url.strip()
        if url and not url.lower().startswith(_INLINE) and url not in distinct:
            distinct.append(url)
    warnings = [
        f"image not fetched (document-supplied URLs are never fetched): {url[:_MAX_URL_CHARS]}"
        for url in distinct[:MAX_LISTED]
    ]
    if len(distinct) > MAX_LISTED:
        warnings.append(f"{len(distinct) - MAX_LISTED} more images were not fetched")
    return warnings
