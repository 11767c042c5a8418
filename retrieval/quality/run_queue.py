"""The jobs-kernel configuration the quality loop's durable runs share (replay and triage runs):
one :class:`knowledgefs.jobs.claims.ClaimedRunQueue` per run model, with the replay settings
(``KNOWLEDGE_QUALITY_REPLAY_{DISPATCH_GRACE,STALE}_SECONDS``, ``…_MAX_ATTEMPTS``) and a one-hour
delivery timeout."""

from __future__ import annotations

import logging

from knowledgefs.jobs import claims

logger = logging.getLogger("knowledgefs.quality")

DELIVERY_TIMEOUT_SECONDS = 3600


def _failed_fields(code: str, message: str, now) -> dict:
    return {"error_code": code[:64], "error_message": message[:4000], "completed_at": now}


def run_queue(model, *, kind: str, task_path: str, after_exhausted: str) -> claims.ClaimedRunQueue:
    """The queue of ``model`` runs (``kind``: ``replay`` or ``triage``, in messages and the
    django-q2 group); ``after_exhausted`` ends the message of a run failed
    ``attempts_exhausted``."""
    return claims.ClaimedRunQueue(
        model=model,
        state_field="state",
        queued="queued",
        running="running",
        failed="failed",
        task_path=task_path,
        group=kind,
        logger=logger,
        publish_error=f"could not publish {kind} run %s; releasing the claim",
        sweep_label=f"{kind} run sweep",
        grace_setting="KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS",
        stale_setting="KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS",
        attempts_setting="KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS",
        timeout=lambda _pk: DELIVERY_TIMEOUT_SECONDS,
        failed_fields=_failed_fields,
        exhausted_message=lambda run: (
            f"the {kind} was started {run.attempt_count} times without finishing (the worker "
            f"was killed, timed out or lost); {after_exhausted}"
        ),
        begin_fields=lambda now: {"started_at": now},
        load=lambda pk: model.objects.select_related("space").get(id=pk),
    )
