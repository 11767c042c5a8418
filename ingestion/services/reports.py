"""Re-exports for callers not yet moved (ingestion.reports)."""

from ingestion.reports import (  # noqa: F401
    PUBLIC_STATES,
    jobs_in,
    latest_job_percents,
    public_state_filter,
    space_stats,
)
