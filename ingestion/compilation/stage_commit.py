"""Committing a stage: a wave's outputs written together with their checkpoints.

The outputs of the jobs still held are written in one transaction with their checkpoint; when
that fails, job by job, so one bad row cannot sink the others.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction

from ingestion.compilation.errors import classify
from ingestion.compilation.failures import end_attempt
from ingestion.compilation.leases import Held, _checkpoint_many

logger = logging.getLogger("knowledgefs.compilation")


def _commit(held: Held, outputs: dict, stage: str, write, *, progress=None) -> dict:
    """Write ``outputs`` of the jobs still held, with their checkpoint, in one transaction.

    ``progress(output)`` gives each job's progress dict. If the batch commit fails, the stage
    is committed job by job so one bad row cannot sink the others. Returns the outputs kept.
    """
    if not outputs:
        return {}

    def commit(job_ids: list[uuid.UUID]) -> set[uuid.UUID]:
        with transaction.atomic():
            # One locked read of the jobs still held, one UPDATE of their checkpoints and
            # progress, then the output.
            per_job = None
            if progress is not None:
                per_job = {"progress": {j: progress(outputs[j]) for j in job_ids}}
            done = _checkpoint_many(
                {j: held.tokens[j] for j in job_ids}, stage=stage, per_job=per_job
            )
            write([outputs[j] for j in job_ids if j in done])
        return done

    live = [j for j in outputs if j in held.tokens]
    try:
        done = commit(live)
    except Exception:  # noqa: BLE001
        logger.exception("batch commit of stage %s failed; committing job by job", stage)
        done = set()
        for job_id in live:
            try:
                done |= commit([job_id])
            except Exception as exc:  # noqa: BLE001
                logger.exception("stage %s of job %s failed", stage, job_id)
                end_attempt(job_id, held.tokens[job_id], classify(exc))
                held.release(job_id)
    for job_id in set(live) - done:
        held.lost.add(job_id)
    return {j: out for j, out in outputs.items() if j in done}
