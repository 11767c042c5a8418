"""The run states of the runs claimed through the jobs kernel (:mod:`.claims`) that share one
life cycle: source runs (``ingestion.sources``) and research tasks (``retrieval.research_tasks``).

``queued`` → ``running`` → ``completed`` | ``failed`` | ``canceled``; a failed or canceled run
can be queued again (a retry). Compilation jobs have states of their own
(``ingestion.models.RunState``: dispatch pending, retry wait, superseded).
"""

from __future__ import annotations

from django.db import models


class RunState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"


#: States of a run that is still to do or being done (one live run per source at a time).
LIVE_RUN_STATES = (RunState.QUEUED, RunState.RUNNING)
#: States after which a run does nothing more.
TERMINAL_RUN_STATES = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELED)
