"""Failed queries (``quality_failed_query``), bad cases (``quality_bad_case``) and a bad case's
immutable history (``quality_bad_case_event``).

Every row keeps its exact requester provenance: ``tenant_id``, ``requester_kind`` (``api_key``,
``capability``, ``operator``), ``requester`` (the principal's owner label: ``key:<id>``, the
capability subject digest, ``operator:<tenant>``), ``caller_kind`` (Dify's caller kind of a
token), ``api_key_id`` or ``grant_id``, and ``permission_scope``: the sorted space ids the
requester could reach, ``None`` for a tenant-wide caller. A row is readable only by a caller of
the same tenant whose own scope covers ``permission_scope`` (:mod:`retrieval.quality.scope`).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.utils import timezone

from spaces.models import KnowledgeSpace


class Provenance(models.Model):
    """The requester fields every quality row carries (abstract)."""

    tenant_id = models.CharField(max_length=64)
    requester_kind = models.CharField(max_length=16)
    requester = models.CharField(max_length=300)
    caller_kind = models.CharField(max_length=32, blank=True, default="")
    api_key_id = models.UUIDField(null=True, blank=True)
    grant_id = models.CharField(max_length=128, blank=True, default="")
    permission_scope = models.JSONField(null=True, blank=True)
    # permission_scope as text for the listings' filter: "" tenant-wide, else "id,id,...".
    scope_key = models.TextField(blank=True, default="")

    class Meta:
        abstract = True

    def provenance(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "requester_kind": self.requester_kind,
            "caller_kind": self.caller_kind or None,
            "api_key_id": str(self.api_key_id) if self.api_key_id else None,
            "grant_id": self.grant_id or None,
            "permission_scope": self.permission_scope,
        }


class FailedQuery(Provenance):
    """One answer that failed: ``trigger`` ``not-enough-evidence`` (the answer said there was
    no evidence), ``low-confidence`` (answered, but the best absolute relevance signal was
    under ``KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT``) or ``user-feedback`` (``helpful:
    false``). One row per trace and trigger.

    ``query`` is the question's text (``""`` when feedback came without it: the trace keeps
    only its SHA-256), kept in this row for triage and never written to a log. ``status``:
    ``pending-triage`` → ``triaged`` → ``pending-annotation`` → ``promoted`` | ``annotated`` |
    ``dismissed``; ``revision`` grows by one per change.
    """

    TRIGGERS = ("not-enough-evidence", "low-confidence", "user-feedback")
    STATUSES = (
        "pending-triage",
        "triaged",
        "pending-annotation",
        "promoted",
        "annotated",
        "dismissed",
    )

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    trace_id = models.UUIDField()
    trigger = models.CharField(max_length=24)
    status = models.CharField(max_length=24, default="pending-triage")
    verdict = models.CharField(max_length=24, blank=True, default="")
    query = models.TextField(blank=True, default="")
    query_sha256 = models.CharField(max_length=64)
    mode = models.CharField(max_length=16, blank=True, default="")
    source = models.CharField(max_length=16, blank=True, default="")
    answerability = models.CharField(max_length=24, blank=True, default="")
    confidence = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    note = models.TextField(blank=True, default="")
    expected_evidence_ids = models.JSONField(default=list, blank=True)
    golden_question_id = models.UUIDField(null=True, blank=True)
    triage_signals = models.JSONField(default=dict, blank=True)
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "quality_failed_query"
        constraints = [
            models.UniqueConstraint(
                fields=["trace_id", "trigger"], name="quality_failed_query_trace_trigger"
            )
        ]
        indexes = [
            models.Index(fields=["space", "-created_at"], name="quality_fq_space_created"),
            models.Index(fields=["tenant_id", "status"], name="quality_fq_tenant_status"),
        ]

    def __str__(self) -> str:
        return f"failed query {self.id} ({self.trigger}, {self.status})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "space_id": str(self.space_id),
            "trace_id": str(self.trace_id),
            "trigger": self.trigger,
            "status": self.status,
            "verdict": self.verdict or None,
            "query": self.query or None,
            "query_sha256": self.query_sha256,
            "mode": self.mode or None,
            "source": self.source or None,
            "answerability": self.answerability or None,
            "confidence": self.confidence,
            "reason": self.reason or None,
            "note": self.note or None,
            "expected_evidence_ids": self.expected_evidence_ids,
            "golden_question_id": str(self.golden_question_id) if self.golden_question_id else None,
            "triage_signals": self.triage_signals or None,
            "revision": self.revision,
            "provenance": self.provenance(),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


class BadCase(Provenance):
    """A curated bad case made from an answer trace: ``status`` ``open | replaying | fixed |
    dismissed`` (``replaying`` needs ``replay_run_id``), changed only by compare-and-set on
    ``revision``; every change appends one :class:`BadCaseEvent`."""

    STATUSES = ("open", "replaying", "fixed", "dismissed")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    trace_id = models.UUIDField()
    query = models.TextField(blank=True, default="")
    reason = models.TextField()
    tags = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, default="open")
    replay_run_id = models.UUIDField(null=True, blank=True)
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "quality_bad_case"
        indexes = [models.Index(fields=["space", "-created_at"], name="quality_bc_space_created")]

    def __str__(self) -> str:
        return f"bad case {self.id} ({self.status})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "space_id": str(self.space_id),
            "trace_id": str(self.trace_id),
            "query": self.query or None,
            "reason": self.reason,
            "tags": self.tags,
            "status": self.status,
            "replay_run_id": str(self.replay_run_id) if self.replay_run_id else None,
            "revision": self.revision,
            "actor_subject_id": self.requester,
            "provenance": self.provenance(),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


class ImmutableRow(Exception):
    """A history row was about to be changed or deleted."""


class BadCaseEvent(models.Model):
    """One immutable entry of a bad case's history, unique per (bad case, revision):
    ``action`` (``created``, ``updated``), ``actor``, ``from_status``, ``to_status``,
    ``reason``. Saving an existing row or deleting one raises :class:`ImmutableRow` (the rows
    go only with their space)."""

    id = models.BigAutoField(primary_key=True)
    bad_case = models.ForeignKey(BadCase, on_delete=models.CASCADE, related_name="events")
    revision = models.PositiveIntegerField()
    action = models.CharField(max_length=16)
    actor = models.CharField(max_length=300)
    from_status = models.CharField(max_length=16, blank=True, default="")
    to_status = models.CharField(max_length=16)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "quality_bad_case_event"
        constraints = [
            models.UniqueConstraint(
                fields=["bad_case", "revision"], name="quality_bad_case_event_revision"
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} r{self.revision}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRow("bad case history rows are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ImmutableRow("bad case history rows are immutable")

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "actor_subject_id": self.actor,
            "from_status": self.from_status or None,
            "to_status": self.to_status,
            "reason": self.reason or None,
            "revision": self.revision,
            "created_at": self.created_at.isoformat(),
        }


class ReplayRun(Provenance):
    """One durable replay of golden questions on a frozen snapshot (docs/quality.md).

    ``state``: ``queued`` → ``running`` → ``passed`` (every item passed) | ``failed`` (an item
    failed, or the run could not go on: ``error_code``) | ``canceled``; ``failed`` and
    ``canceled`` (and ``passed``) → ``queued`` by a retry, which takes a fresh snapshot and
    counts ``attempt``. The delivery claim is the jobs kernel's (``task_id``, ``claimed_at``,
    ``step_started_at``, ``attempt_count``: :mod:`retrieval.quality.replay_dispatch`).
    ``frozen_snapshot`` is ``{publication_revision, index_version{number, model_id, dimension},
    embedding_model, retrieval_profile{revision, top_k, mode, reasoning_model,
    rerank_model}}``; ``revision`` guards cancel and retry (compare-and-set).
    """

    STATES = ("queued", "running", "passed", "failed", "canceled")
    TERMINAL = ("passed", "failed", "canceled")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    mode = models.CharField(max_length=16)
    selection = models.CharField(max_length=16)  # "ids" or "all-active"
    state = models.CharField(max_length=16, default="queued")
    attempt = models.PositiveIntegerField(default=1)
    revision = models.PositiveIntegerField(default=1)
    frozen_snapshot = models.JSONField(default=dict)
    summary = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=80)
    task_id = models.CharField(max_length=64, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "quality_replay_run"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "requester", "idempotency_key"],
                name="quality_replay_run_idempotency",
            )
        ]
        indexes = [
            models.Index(fields=["space", "-created_at"], name="quality_rr_space_created"),
            models.Index(fields=["state", "updated_at"], name="quality_rr_state_updated"),
        ]

    def __str__(self) -> str:
        return f"replay run {self.id} ({self.state})"


class ReplayItem(models.Model):
    """One golden question of a run: ``state`` ``pending`` → ``passed`` | ``failed``; unique
    per run and question and per run and ordinal. ``question``, ``expected_evidence`` and
    ``match_policy`` are copied at creation (frozen); ``result`` is ``{passed, evidence_diff
    {expected_count, retrieved_count, matched_count, missing_count, evidence_items}}``,
    ``metrics`` ``{candidates{leg: n}, total_ms, publication_revision}``."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(ReplayRun, on_delete=models.CASCADE, related_name="items")
    golden_question_id = models.UUIDField()
    ordinal = models.PositiveIntegerField()
    question = models.TextField()
    expected_evidence = models.JSONField(default=list)
    match_policy = models.CharField(max_length=8, default="all")
    state = models.CharField(max_length=16, default="pending")
    result = models.JSONField(default=dict, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "quality_replay_item"
        constraints = [
            models.UniqueConstraint(
                fields=["run", "golden_question_id"], name="quality_replay_item_question"
            ),
            models.UniqueConstraint(fields=["run", "ordinal"], name="quality_replay_item_ordinal"),
        ]

    def __str__(self) -> str:
        return f"item {self.ordinal} ({self.state})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "golden_question_id": str(self.golden_question_id),
            "ordinal": self.ordinal,
            "question": self.question,
            "match_policy": self.match_policy,
            "state": self.state,
            "result": self.result or None,
            "metrics": self.metrics or None,
        }


class TriageRun(Provenance):
    """One durable triage of a space's ``pending-triage`` failed queries (docs/quality.md).

    ``state``: ``queued`` → ``running`` → ``succeeded`` | ``failed`` (``error_code``) |
    ``canceled``; a finished run → ``queued`` again by a retry (``attempt`` + 1). ``revision``
    guards cancel and retry (compare-and-set). It labels at most ``row_limit`` rows the
    requester's provenance covers, in batches; ``summary`` is ``{triaged, verdicts{...}}`` kept
    across the deliveries of one attempt. The delivery claim is the jobs kernel's
    (``task_id``, ``claimed_at``, ``step_started_at``, ``attempt_count``:
    :mod:`retrieval.quality.triage_dispatch`).
    """

    STATES = ("queued", "running", "succeeded", "failed", "canceled")
    TERMINAL = ("succeeded", "failed", "canceled")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=16, default="queued")
    attempt = models.PositiveIntegerField(default=1)
    revision = models.PositiveIntegerField(default=1)
    row_limit = models.PositiveIntegerField()
    summary = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=80)
    task_id = models.CharField(max_length=64, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "quality_triage_run"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "requester", "idempotency_key"],
                name="quality_triage_run_idempotency",
            )
        ]
        indexes = [
            models.Index(fields=["space", "-created_at"], name="quality_tr_space_created"),
            models.Index(fields=["state", "updated_at"], name="quality_tr_state_updated"),
        ]

    def __str__(self) -> str:
        return f"triage run {self.id} ({self.state})"
