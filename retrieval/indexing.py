"""Re-exports for callers not yet moved."""

from retrieval.index_versions import ensure_active_version  # noqa: F401
