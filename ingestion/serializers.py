"""Re-exports for callers not yet moved (ingestion.api.serializers)."""

from ingestion.api.serializers import DocumentSerializer, JobSerializer  # noqa: F401
