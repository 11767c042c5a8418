"""django-q2 task entry points: they take ids and call the compilation service."""

from __future__ import annotations

from ingestion import storage_sweep, upload_sessions
from ingestion.compilation import pipeline, recovery


def compile_document(job_id: str, delivery_id: str | None = None) -> str | None:
    """Compile the job if ``delivery_id`` still claims it (safe to deliver twice); run state."""
    return pipeline.run_job(job_id, delivery_id)


def recover_jobs() -> dict[str, int]:
    """The recovery sweep (scheduled every minute by migration ``ingestion.0003``), then the
    expiry of upload sessions (a bounded batch: ingestion.upload_sessions.sweep_expired)."""
    report = recovery.recover_jobs().as_dict()
    sessions = upload_sessions.sweep_expired()
    report.update({f"upload_sessions_{name}": count for name, count in sessions.items()})
    return report


def report_unreferenced_objects() -> dict[str, int]:
    """The daily storage report (a dry run of ``kfs storage sweep``: counts, never deletes)."""
    return storage_sweep.report_unreferenced()


def run_source(run_pk: str, delivery: str) -> str:
    """Run a source import or sync if ``delivery`` still claims it (ingestion.sources.runner)."""
    from ingestion.sources import runner

    return runner.run_delivery(run_pk, delivery)


def sweep_source_runs() -> dict[str, int]:
    """The recovery sweep of source runs (every minute: ``ingestion.sources.dispatch.SWEEP``)."""
    from ingestion.sources import dispatch

    return dispatch.QUEUE.sweep().as_dict()


def start_due_source_syncs() -> dict[str, int]:
    """Start the syncs whose policy is due and remove documents of items gone past the retention
    (every minute: ``ingestion.sources.dispatch.DUE``)."""
    from ingestion.sources import policy

    return policy.start_due()
