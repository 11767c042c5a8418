"""Reading a published document's stored image assets (``GET …/documents/{id}/assets/{asset}``).

An asset is addressed by its position in the published generation's ``ParseArtifact.assets``
(the ``asset_index`` visual projections and image citations carry); ``variant`` picks a
rendition of it (``thumbnail``: the page thumbnail of a PDF page image). The stored size is
checked against ``KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES`` before any byte is read (413), and
the read itself stops at that limit. Only PNG, JPEG, GIF and WebP whose bytes are what their type
says are served inline; everything else (SVG, TIFF, EMF, a mismatch) is an attachment of type
``application/octet-stream``. The view adds ``X-Content-Type-Options: nosniff`` and the
sandboxing ``Content-Security-Policy`` to every answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from ingestion.documents import get_document
from ingestion.models import ParseArtifact
from knowledgefs import storage
from knowledgefs.auth.principal import Principal
from knowledgefs.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge

INLINE = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
_VARIANT = re.compile(r"^[A-Za-z0-9._=-]{1,64}$")
VARIANTS = ("thumbnail",)


class AssetTooLarge(PayloadTooLarge):
    """413: the stored asset is larger than the route serves."""

    code = "asset_too_large"


@dataclass(frozen=True)
class AssetBody:
    data: bytes
    content_type: str
    inline: bool
    filename: str
    sha256: str


def _inline(mime_type: str, data: bytes) -> bool:
    magics = INLINE.get(mime_type)
    if not magics or not any(data.startswith(m) for m in magics):
        return False
    return mime_type != "image/webp" or data[8:12] == b"WEBP"


def read_asset(
    principal: Principal, space_id, document_id, asset_id: str, *, variant: str | None = None
) -> AssetBody:
    """The bytes of one asset of the document's published generation (see the module doc)."""
    if variant is not None and not _VARIANT.fullmatch(variant):
        raise InvalidInput(
            "variant must be 1 to 64 characters of letters, digits, '.', '_', '=' or '-'",
            code="invalid_variant",
            details={"field": "variant"},
        )
    document = get_document(principal, space_id, document_id)
    if not document.enabled:
        raise Conflict(
            "the document is disabled and its content is not served; enable it first",
            code="document_disabled",
        )
    if document.active_generation is None:
        raise Conflict("the document has no published version yet", code="document_not_published")
    assets = (
        ParseArtifact.objects.filter(job_id=document.active_generation)
        .values_list("assets", flat=True)
        .first()
    ) or []
    if not (asset_id.isascii() and asset_id.isdigit() and int(asset_id) < len(assets)):
        raise NotFound(
            f"the document has no asset {asset_id[:40]!r} ({len(assets)} assets: 0.."
            f"{max(len(assets) - 1, 0)})",
            code="asset_not_found",
        )
    index = int(asset_id)
    asset = assets[index]
    if variant is not None:
        found = None
        if variant == "thumbnail" and asset.get("page_number") is not None:
            found = next(
                (
                    a
                    for a in assets
                    if a.get("kind") == "thumbnail" and a.get("page_number") == asset["page_number"]
                ),
                None,
            )
        if found is None:
            raise NotFound(
                f"asset {index} has no variant {variant!r} (variants: "
                f"{', '.join(VARIANTS)} of PDF page images)",
                code="asset_variant_not_found",
            )
        asset = found
    limit = settings.KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES
    recorded = int(asset.get("bytes") or 0)
    if recorded > limit:
        raise AssetTooLarge(
            f"the asset is {recorded} bytes; this route serves at most {limit} "
            "(KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES)",
            code="asset_too_large",
        )
    try:
        data = storage.read_object(asset["key"], max_bytes=limit)
    except ValueError:
        raise AssetTooLarge(
            f"the asset is larger than {limit} bytes (KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES)",
            code="asset_too_large",
        ) from None
    except FileNotFoundError:
        raise NotFound("the asset's stored object is gone", code="asset_not_found") from None
    mime_type = str(asset.get("mime_type") or "")
    inline = _inline(mime_type, data)
    extension = asset["key"].rsplit(".", 1)[-1] if "." in asset["key"] else "bin"
    return AssetBody(
        data=data,
        content_type=mime_type if inline else "application/octet-stream",
        inline=inline,
        filename=f"{document.id}-asset-{index}{'-' + variant if variant else ''}.{extension}",
        sha256=str(asset.get("sha256") or ""),
    )
