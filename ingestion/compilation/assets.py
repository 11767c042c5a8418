"""Parse assets (images) in object storage: their keys, storing them all or none, deleting them.

A job's assets live under ``assets/<space>/<document>/<job>/<n>.<ext>``; the parse artifact's
``assets`` list is the only reference to them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

from django.db import transaction

from ingestion import parsing
from ingestion.compilation.errors import CompilationFailure
from ingestion.models import CompilationJob
from knowledgefs import storage

logger = logging.getLogger("knowledgefs.compilation")


_ASSET_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/bmp": "bmp",
    "image/tiff": "tif",
    "image/webp": "webp",
    "image/heic": "heic",
    "image/heif": "heif",
    "image/svg+xml": "svg",
    "image/x-emf": "emf",
    "image/x-wmf": "wmf",
}


def asset_key(job: CompilationJob, index: int, mime_type: str) -> str:
    """Object key of a job's ``index``-th asset: ``assets/<space>/<document>/<job>/<n>.<ext>``."""
    ext = _ASSET_EXTENSIONS.get(mime_type, "bin")
    return f"assets/{job.space_id}/{job.document_id}/{job.id}/{index}.{ext}"


def store_assets(job: CompilationJob, assets: list[parsing.Asset]) -> list[dict]:
    """Write every asset through the storage boundary; returns the artifact's ``assets`` list.

    All or nothing: when a write fails, the objects already written are deleted and a
    :class:`CompilationFailure` is raised: ``storage_unavailable`` (retryable; a file-system
    ``OSError`` or a retryable Dify storage error) or ``storage_error`` (terminal).
    """
    stored: list[dict] = []
    try:
        for index, asset in enumerate(assets):
            key = asset_key(job, index, asset.mime_type)
            storage.put_object(key, asset.data)
            stored.append(
                {
                    "key": key,
                    "kind": asset.kind,
                    "name": asset.name,
                    "page_number": asset.page_number,
                    "mime_type": asset.mime_type,
                    "width": asset.width,
                    "height": asset.height,
                    "bytes": len(asset.data),
                    "sha256": hashlib.sha256(asset.data).hexdigest(),
                    "element_index": asset.element_index,
                }
            )
    except Exception as exc:
        delete_assets(stored)
        if len(stored) < len(assets):  # the failed write may have left a partial object
            delete_assets([{"key": asset_key(job, len(stored), assets[len(stored)].mime_type)}])
        if not isinstance(exc, OSError):
            raise
        retryable = getattr(exc, "retryable", True)
        raise CompilationFailure(
            "storage_unavailable" if retryable else "storage_error",
            f"could not store the document's images ({type(exc).__name__})",
            retryable=retryable,
        ) from exc
    return stored


def delete_assets(assets: Iterable[dict]) -> int:
    """Delete stored asset objects best effort (a failure is logged, not raised); returns the
    number deleted. A missing object counts as deleted."""
    deleted = 0
    for asset in assets:
        try:
            storage.delete_object(asset["key"])
            deleted += 1
        except Exception:  # noqa: BLE001 - logged; the rows are what clients see
            logger.warning("could not delete asset object %s", asset["key"], exc_info=True)
    return deleted


def _delete_assets_on_commit(artifacts) -> None:
    """After the surrounding transaction commits, delete the assets of these artifact rows."""
    assets = [a for row in artifacts for a in (row or [])]
    if assets:
        transaction.on_commit(lambda: delete_assets(assets))
