"""Re-exports for callers not yet moved."""

from .api.answers import QueryTraceView, QueryView  # noqa: F401
