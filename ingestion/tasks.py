"""django-q2 task entry points: they take ids and call the compilation service."""

from __future__ import annotations

from ingestion.services import compilation


def compile_document(job_id: str) -> str:
    """Compile the job (safe to deliver twice); returns its run state."""
    return compilation.run_job(job_id)
