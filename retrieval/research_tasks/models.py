"""Research tasks (table ``research_task``) and their partial evidence (``research_task_partial``).

A task is one durable Research run. ``run_state`` is the claim's state machine (``queued`` →
``running`` → ``completed`` | ``failed`` | ``canceled``; ``failed``/``canceled`` → ``queued`` by a
resume); ``stage`` is the public progress (``queued``, ``planning``, ``retrieving``,
``analyzing``, ``generating``, then the terminal ``completed``/``failed``/``canceled``).

The **delivery claim** is ``task_id``, exactly as for upgrade jobs: a dispatch writes a fresh
``task_id`` (and ``claimed_at``) on a ``queued`` task without one and commits before it enqueues;
a delivery starts only by a compare-and-set ``queued`` → ``running`` with that ``task_id``
(counting ``attempt_count``), and every checkpoint, partial and final write is conditioned on
``running`` with it. ``checkpoint`` holds the finished model calls' validated outputs as
:func:`retrieval.research.run_research` hands them over, so a resumed run repeats none of them.

``score_threshold`` is the space's retrieval-profile threshold frozen at creation (``None``:
off), so a resume ranks as the first run did. ``limits`` is ``{"max_model_calls",
"timeout_ms"}``; ``plan`` the estimate the task was admitted
with; ``result`` (when ``completed``) ``{"items", "metrics", "plan", "stages"}`` as retrieval
returns them; provenance (``owner``, ``api_key_id``, ``subject``, ``caller_kind``) records who
created it; only that owner (or an operator) reads it. ``idempotency_key`` is unique per tenant.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from knowledgefs.jobs.run_states import LIVE_RUN_STATES as LIVE_RUN_STATES
from knowledgefs.jobs.run_states import RunState as RunState
from spaces.models import KnowledgeSpace


class Stage(models.TextChoices):
    """Public progress (reference inventory §2.12)."""

    QUEUED = "queued", "Queued"
    PLANNING = "planning", "Planning"
    RETRIEVING = "retrieving", "Retrieving"
    ANALYZING = "analyzing", "Analyzing"
    GENERATING = "generating", "Generating"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"


class ResearchTask(models.Model):
    """One durable Research run of a query over a knowledge space (see the module docstring)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(
        KnowledgeSpace, on_delete=models.CASCADE, related_name="research_tasks"
    )
    owner = models.CharField(max_length=300)
    api_key_id = models.UUIDField(null=True, blank=True)
    subject = models.CharField(max_length=256, blank=True, default="")
    caller_kind = models.CharField(max_length=32, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")

    query = models.TextField()
    top_k = models.PositiveSmallIntegerField()
    score_threshold = models.FloatField(null=True, blank=True)
    filters = models.JSONField(null=True, blank=True)
    limits = models.JSONField(default=dict)
    plan = models.JSONField(default=dict, blank=True)
    # The request's query images: [{"upload_file_id"}] as sent (never their bytes); the run
    # resolves them once and keeps only their id, digest, size and type in its checkpoint.
    query_images = models.JSONField(default=list, blank=True)

    run_state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.QUEUED)
    checkpoint = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    attempt_count = models.PositiveIntegerField(default=0)
    resume_count = models.PositiveIntegerField(default=0)
    elapsed_ms = models.PositiveIntegerField(default=0)

    # Delivery claim (fencing token).
    task_id = models.CharField(max_length=64, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "research_task"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "idempotency_key"], name="research_task_idempotency_uq"
            ),
            models.CheckConstraint(
                condition=Q(top_k__gte=1) & Q(top_k__lte=50), name="research_task_top_k_ck"
            ),
        ]
        indexes = [
            models.Index(fields=["run_state", "updated_at"], name="research_task_state_idx"),
            models.Index(fields=["space", "-created_at"], name="research_task_space_idx"),
        ]

    def __str__(self) -> str:
        return f"research task {self.id} ({self.run_state}/{self.stage})"


class ResearchTaskPartial(models.Model):
    """One piece of partial evidence of a task: ``sequence`` counts from 1 per task; ``kind`` is
    ``round`` (the evidence of a finished retrieval round, as Research reported it) or ``final``
    (the task's result); ``evidence`` is ``{"items": [...], "metrics": {...}}``."""

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(ResearchTask, on_delete=models.CASCADE, related_name="partials")
    sequence = models.PositiveIntegerField()
    kind = models.CharField(max_length=16)
    evidence = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "research_task_partial"
        constraints = [
            models.UniqueConstraint(
                fields=["task", "sequence"], name="research_task_partial_sequence_uq"
            )
        ]

    def __str__(self) -> str:
        return f"partial {self.sequence} ({self.kind}) of {self.task_id}"
