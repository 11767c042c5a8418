"""Claims, fenced writes and the recovery sweep of replay runs: a configuration of the jobs
kernel :class:`knowledgefs.jobs.claims.ClaimedRunQueue` (as research tasks and upgrade jobs).

* claim before enqueue (``QUEUE.dispatch``, ``QUEUE.dispatch_on_commit``);
* start (``QUEUE.begin``): ``queued`` → ``running`` with the delivery's own ``task_id``;
* fenced writes (``QUEUE.held``, ``QUEUE.fail``): each item's result is written only while the run
  is ``running`` under that ``task_id`` (a cancel or a sweep that took it back makes them match
  nothing);
* sweep (``QUEUE.sweep``, every minute from the registered schedule :data:`SWEEP`): a claim never
  delivered, a run whose delivery has not written for ``KNOWLEDGE_QUALITY_REPLAY_STALE_SECONDS``
  (the worker was killed) put back to ``queued`` and dispatched (its finished items are kept:
  the next delivery runs only the pending ones), or failed ``attempts_exhausted`` after
  ``KNOWLEDGE_QUALITY_REPLAY_MAX_ATTEMPTS`` deliveries.
"""

from __future__ import annotations

from knowledgefs.jobs import claims, schedules

from .models import ReplayRun
from .run_queue import run_queue

RUN_TASK = "retrieval.quality.tasks.run_replay"
SWEEP_TASK = "retrieval.quality.tasks.sweep_replay_runs"
SWEEP_SCHEDULE = "knowledgefs.quality.replay_sweep"
SWEEP = schedules.Schedule(SWEEP_SCHEDULE, SWEEP_TASK)


QUEUE = run_queue(
    ReplayRun, kind="replay", task_path=RUN_TASK, after_exhausted="retry it once the cause is fixed"
)

ClaimLost = claims.ClaimLost
