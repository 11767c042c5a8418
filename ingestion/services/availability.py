"""Re-exports for callers not yet moved (ingestion.availability)."""

from ingestion.availability import (  # noqa: F401
    MAX_METADATA_BYTES,
    MAX_METADATA_KEY_CHARS,
    StaleRowVersion,
    patch_document_metadata,
    set_document_availability,
    update_document,
    validate_metadata_patch,
)
