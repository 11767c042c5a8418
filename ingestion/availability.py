"""A document's availability (``enabled``) and metadata, written by compare-and-set on its row
version.

Every change of ``enabled`` or ``metadata`` is one conditional ``UPDATE … WHERE id = … AND
row_version = expected`` that also moves ``row_version`` forward by one, so two writers that read
the same version cannot both win: the second gets :class:`StaleRowVersion` (409
``document_version_conflict``) and must read again. A write that changes nothing still checks the
version but keeps it (an idempotent repeat returns the current version).

Turning availability on or off also advances the space's publication head in the same
transaction, so caches keyed by the head (the dense matrix) are rebuilt and no query after the
commit sees the old availability.
"""

from __future__ import annotations

import json
import uuid

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ingestion.models import Document
from knowledgefs.errors import Conflict, InvalidInput, NotFound
from spaces.models import PublicationHead

# Serialized size limit of one document's metadata (JSON, UTF-8): 64 KiB keeps a row small;
# Dify's legacy document metadata is a handful of short fields.
MAX_METADATA_BYTES = 64 * 1024
MAX_METADATA_KEY_CHARS = 255


class StaleRowVersion(Conflict):
    """409 ``document_version_conflict``: the document changed since ``expected_row_version``
    was read; ``details`` carries ``{"expected", "current"}`` (``current`` None if it is gone)."""

    code = "document_version_conflict"


def _doc_uuid(document_id) -> uuid.UUID:
    try:
        return uuid.UUID(str(document_id))
    except ValueError:
        raise NotFound("document not found", code="document_not_found") from None


def _check_version(expected_row_version) -> int:
    if (
        isinstance(expected_row_version, bool)
        or not isinstance(expected_row_version, int)
        or expected_row_version < 1
    ):
        raise InvalidInput(
            "expected_row_version must be a positive integer (the document's row_version)",
            code="invalid_row_version",
        )
    return expected_row_version


def validate_metadata_patch(patch) -> dict:
    """Check a metadata patch: a JSON object with string keys of at most 255 characters; a
    ``null`` value removes the key. Raises 400 ``invalid_metadata`` naming the rule."""
    if not isinstance(patch, dict):
        raise InvalidInput("metadata must be a JSON object", code="invalid_metadata")
    for key in patch:
        if not isinstance(key, str) or not key or len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidInput(
                f"metadata keys must be non-empty strings of at most {MAX_METADATA_KEY_CHARS} "
                "characters",
                code="invalid_metadata",
            )
    try:
        json.dumps(patch, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"metadata must be plain JSON values ({exc})", code="invalid_metadata"
        ) from None
    return patch


def _stale(document_id: uuid.UUID, expected: int) -> StaleRowVersion | NotFound:
    current = Document.objects.filter(id=document_id).values_list("row_version", flat=True).first()
    if current is None:
        return NotFound("document not found", code="document_not_found")
    return StaleRowVersion(
        f"the document is at row_version {current}, not {expected}; read it again",
        details={"expected": expected, "current": current},
    )


def _write(document_id: uuid.UUID, expected: int, **values) -> int:
    """The compare-and-set itself; returns the new version or raises."""
    updated = Document.objects.filter(id=document_id, row_version=expected).update(
        row_version=F("row_version") + 1, updated_at=timezone.now(), **values
    )
    if not updated:
        raise _stale(document_id, expected)
    return expected + 1


def set_document_availability(document_id, enabled: bool, expected_row_version: int) -> int:
    """Turn a document on (``True``) or off (``False``); returns the new ``row_version``.

    Fenced on ``expected_row_version`` (:class:`StaleRowVersion` otherwise). When the flag
    already has that value the version is only checked, not moved. The publication head of the
    space advances in the same transaction, so cached indexes see the change at once.
    """
    if not isinstance(enabled, bool):
        raise InvalidInput("enabled must be true or false", code="invalid_availability")
    expected = _check_version(expected_row_version)
    doc_id = _doc_uuid(document_id)
    with transaction.atomic():
        row = (
            Document.objects.filter(id=doc_id).values("enabled", "row_version", "space_id").first()
        )
        if row is None:
            raise NotFound("document not found", code="document_not_found")
        if row["row_version"] != expected:
            raise _stale(doc_id, expected)
        if row["enabled"] == enabled:
            return expected
        version = _write(doc_id, expected, enabled=enabled)
        PublicationHead.objects.advance(row["space_id"])
        return version


def patch_document_metadata(document_id, patch: dict, expected_row_version: int) -> int:
    """Merge ``patch`` into the document's metadata (a ``null`` value removes the key); returns
    the new ``row_version``.

    Rules of :func:`validate_metadata_patch`; the merged result is at most 64 KiB of JSON.
    Fenced on ``expected_row_version``. A patch that changes nothing keeps the version. A change
    advances the space's publication head in the same transaction (retrieval keeps the
    documents a filter allows per head revision).
    """
    patch = validate_metadata_patch(patch)
    expected = _check_version(expected_row_version)
    doc_id = _doc_uuid(document_id)
    with transaction.atomic():
        row = (
            Document.objects.filter(id=doc_id).values("metadata", "row_version", "space_id").first()
        )
        if row is None:
            raise NotFound("document not found", code="document_not_found")
        if row["row_version"] != expected:
            raise _stale(doc_id, expected)
        current = dict(row["metadata"] or {})
        merged = {k: v for k, v in {**current, **patch}.items() if v is not None}
        if merged == current:
            return expected
        size = len(json.dumps(merged, ensure_ascii=False).encode())
        if size > MAX_METADATA_BYTES:
            raise InvalidInput(
                f"metadata would be {size} bytes of JSON; the limit is {MAX_METADATA_BYTES}",
                code="invalid_metadata",
            )
        version = _write(doc_id, expected, metadata=merged)
        PublicationHead.objects.advance(row["space_id"])
        return version


def update_document(
    principal,
    space_id,
    document_id,
    *,
    expected_row_version,
    enabled=None,
    metadata: dict | None = None,
) -> Document:
    """The public document PATCH: metadata (merged, see :func:`patch_document_metadata`) then
    availability, chaining the row version, both or neither in one transaction; returns the
    document as stored.

    At least one field is required; a document outside the principal's reach is not found.
    """
    from ingestion.documents import get_document

    document = get_document(principal, space_id, document_id)
    if enabled is None and metadata is None:
        raise InvalidInput("give 'enabled' and/or 'metadata' to change", code="invalid_request")
    version = _check_version(expected_row_version)
    with transaction.atomic():
        if metadata is not None:
            version = patch_document_metadata(document.id, metadata, version)
        if enabled is not None:
            version = set_document_availability(document.id, enabled, version)
    document.refresh_from_db()
    return document
