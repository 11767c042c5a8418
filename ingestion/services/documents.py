"""Re-exports for callers not yet moved (ingestion.documents)."""

from ingestion.documents import (  # noqa: F401
    DUPLICATE_POLICIES,
    MAX_FILENAME_CHARS,
    MAX_TEXT_SLICE,
    Admission,
    admit_document,
    delete_document,
    documents_in,
    get_document,
    get_job,
    published_text,
    purge_documents,
    storage_key_for,
    supported_types,
    validate_filename,
)
