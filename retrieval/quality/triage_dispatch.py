"""Claims, fenced writes and the recovery sweep of triage runs: a configuration of the jobs
kernel :class:`knowledgefs.jobs.claims.ClaimedRunQueue`, exactly as replay runs
(:mod:`.replay_dispatch`), sharing their settings: a claim never delivered is taken back after
``KNOWLEDGE_QUALITY_REPLAY_DISPATCH_GRACE_SECONDS``; a run whose delivery has not written for
``KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS`` (the worker was killed) is put back to ``queued`` and
dispatched (rows it labelled stay labelled: the next delivery takes only the ones still
``pending-triage``), or failed ``attempts_exhausted`` after
``KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS`` deliveries. The sweep runs every minute from the
registered schedule :data:`SWEEP`.
"""

from __future__ import annotations

from knowledgefs.jobs import claims, schedules

from .models import TriageRun
from .run_queue import run_queue

RUN_TASK = "retrieval.quality.tasks.run_triage"
SWEEP_TASK = "retrieval.quality.tasks.sweep_triage_runs"
SWEEP_SCHEDULE = "knowledgefs.quality.triage_sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)


QUEUE = run_queue(
    TriageRun,
    kind="triage",
    task_path=RUN_TASK,
    after_exhausted="start a new one once the cause is fixed",
)

ClaimLost = claims.ClaimLost
