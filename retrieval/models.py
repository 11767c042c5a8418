"""Index projections kept by the portable part of the search backend.

The keyword projection is engine-specific (per-space tantivy indexes under
``KNOWLEDGE_VAR_DIR`` on SQLite, :mod:`retrieval.keyword_index`; a tsvector table on PostgreSQL,
created by this app's migrations) and is not declared as a model. Dense vectors
belong to an :class:`IndexVersion` of their space: one embedding model, one dimension.
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from django.db import models
from django.db.models import Q

from ingestion.models import KnowledgeNode
from knowledgefs.db import SpaceScopedQuerySet
from spaces.models import KnowledgeSpace


class IndexState(models.TextChoices):
    BUILDING = "building", "Building"
    ACTIVE = "active", "Active"
    RETIRED = "retired", "Retired"


class IndexVersionInfo(TypedDict):
    """An index version as the API shows it (:meth:`IndexVersion.as_dict`)."""

    number: int
    model_id: str
    dimension: int


class IndexVersionSummary(TypedDict):
    """The live versions of a space (:meth:`IndexVersionQuerySet.summary`)."""

    active: IndexVersionInfo | None
    building: IndexVersionInfo | None


class AnswerTraceInfo(TypedDict):
    """An answer trace as the API shows it (:meth:`AnswerTrace.as_dict`)."""

    id: str
    tenant_id: str
    space_id: str
    requester_kind: str
    source: str
    requested_mode: str | None
    mode: str
    query_sha256: str
    query_chars: int
    steps: list[dict[str, Any]]
    evidence_node_ids: list[str]
    answerability: str | None
    finish_reason: str | None
    error_code: str | None
    completed: bool
    created_at: str | None
    completed_at: str | None


class IndexVersionQuerySet(models.QuerySet["IndexVersion"]):
    def summary(self) -> IndexVersionSummary:
        """``{"active": {number, model_id, dimension} | None, "building": … | None}`` of the
        live versions among these (a prefetched ``space.index_versions`` is not queried again)."""
        live = (IndexState.ACTIVE, IndexState.BUILDING)
        by_state = {v.state: v for v in self if v.state in live}
        return {
            "active": (
                by_state[IndexState.ACTIVE].as_dict() if IndexState.ACTIVE in by_state else None
            ),
            "building": (
                by_state[IndexState.BUILDING].as_dict() if IndexState.BUILDING in by_state else None
            ),
        }


class IndexVersion(models.Model):
    """One dense index of a space, filled by one embedding model.

    A space has at most one ``active`` version (the one queries use) and at most one
    ``building`` version (filled beside it after an embedding-model change); both are partial
    unique constraints. The cutover is one transaction under the space's row lock that moves
    ``building`` → ``active`` and the old ``active`` → ``retired`` by compare-and-set on
    ``state`` and copies ``model_id``/``dimension`` to the space's ``embedding_model_id`` and
    ``embedding_dimension``, so those two always describe the active version. ``number`` grows
    by one per space and names the version in :class:`DenseVector` rows.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(
        KnowledgeSpace, on_delete=models.CASCADE, related_name="index_versions"
    )
    number = models.PositiveIntegerField()
    model_id = models.CharField(max_length=200)
    dimension = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=IndexState.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    # A building version's last progress (a committed batch, or an enqueue); the recovery sweep
    # re-enqueues builds whose progress stopped.
    progress_at = models.DateTimeField(null=True, blank=True)
    vectors_purged_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    objects = IndexVersionQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["space", "number"], name="index_version_number"),
            models.UniqueConstraint(
                fields=["space"], condition=Q(state="active"), name="one_active_index_version"
            ),
            models.UniqueConstraint(
                fields=["space"], condition=Q(state="building"), name="one_building_index_version"
            ),
        ]
        indexes = [models.Index(fields=["state", "progress_at"], name="index_version_progress")]

    def __str__(self) -> str:
        return f"index v{self.number} ({self.model_id}, {self.state}) of {self.space_id}"

    def as_dict(self) -> IndexVersionInfo:
        return {"number": self.number, "model_id": self.model_id, "dimension": self.dimension}


class DenseVector(models.Model):
    """The dense-vector projection of one node in one index version of its space.

    ``vector`` holds float32 little-endian bytes of ``dimension``; ``index_version`` is the
    :attr:`IndexVersion.number` within the node's space. A node has at most one vector per
    version.
    """

    node = models.ForeignKey(KnowledgeNode, on_delete=models.CASCADE, related_name="dense_vectors")
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    index_version = models.PositiveIntegerField()
    model_id = models.CharField(max_length=200)
    dimension = models.PositiveIntegerField()
    vector = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "index_version"], name="dense_node_version")
        ]
        indexes = [
            models.Index(fields=["space", "index_version"], name="dense_space_version"),
        ]


class AnswerTrace(models.Model):
    """The record of one answer run (``POST /v1/queries``, ``kfs answer``); ``id`` is the query
    run id sent as ``X-Query-Run-Id``.

    ``steps`` is ``[{name, status ok|error|skipped, started_at, ended_at, metadata}]`` with the
    names ``query.route``, ``query.embed``, ``query.retrieve``, ``query.answer``,
    ``query.generate`` (docs/retrieval.md, "Answers"). Who asked: ``requester_kind``
    (``api_key``, ``capability``, ``operator``), ``requester`` (the principal's owner label:
    ``key:<id>``, the token subject, or ``operator:<tenant>``), ``api_key_id``, ``grant_id``.
    ``mode`` is the concrete mode run, ``requested_mode`` what the caller asked (``""``: the
    profile's default). The query is kept only as its SHA-256 and length: the trace never holds
    prompt text, the answer, the query text or its vector. ``completed`` turns true when the run
    ended (done, error, or the client went away); ``created_at`` is when the row was written
    (evidence ready), ``completed_at`` when it ended.
    """

    SOURCES = (("service_api", "Service API"), ("cli", "Command line"), ("retrieval_test", "Test"))

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="+")
    requester_kind = models.CharField(max_length=16)
    requester = models.CharField(max_length=300)
    api_key_id = models.UUIDField(null=True, blank=True)
    grant_id = models.CharField(max_length=128, blank=True, default="")
    source = models.CharField(max_length=16, choices=SOURCES)
    requested_mode = models.CharField(max_length=16, blank=True, default="")
    mode = models.CharField(max_length=16)
    query_sha256 = models.CharField(max_length=64)
    query_chars = models.PositiveIntegerField()
    steps = models.JSONField(default=list, blank=True)
    evidence_node_ids = models.JSONField(default=list, blank=True)
    answerability = models.CharField(max_length=24, blank=True, default="")
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    completed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant_id", "-created_at"], name="answer_trace_tenant"),
            models.Index(fields=["space", "-created_at"], name="answer_trace_space"),
        ]

    def __str__(self) -> str:
        return f"answer trace {self.id} ({self.mode}, {self.answerability or 'running'})"

    def as_dict(self) -> AnswerTraceInfo:
        return {
            "id": str(self.id),
            "tenant_id": self.tenant_id,
            "space_id": str(self.space_id),
            "requester_kind": self.requester_kind,
            "source": self.source,
            "requested_mode": self.requested_mode or None,
            "mode": self.mode,
            "query_sha256": self.query_sha256,
            "query_chars": self.query_chars,
            "steps": self.steps,
            "evidence_node_ids": self.evidence_node_ids,
            "answerability": self.answerability or None,
            "finish_reason": self.finish_reason or None,
            "error_code": self.error_code or None,
            "completed": self.completed,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
        }


class GoldenQuestion(models.Model):
    """A question of a space with the evidence a good retrieval must return for it.

    ``expected_evidence`` is a list of 1..50 objects, each naming at least one of
    ``document_id`` (the document the evidence is in: stable across recompilations),
    ``text`` (a snippet that must appear in a returned chunk, compared case- and
    whitespace-insensitively: stable across re-chunking) and ``node_id`` (one exact chunk: it
    changes when the document is compiled again). ``tags`` holds at most 20 strings of at most 80
    characters; ``metadata`` is free JSON (at most 64 KiB). ``revision`` grows by one per update
    (compare-and-set with ``If-Match``). Limits: reference inventory §2.13, §3.5.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(
        KnowledgeSpace, on_delete=models.CASCADE, related_name="golden_questions"
    )
    question = models.TextField()
    expected_evidence = models.JSONField(default=list)
    tags = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    revision = models.PositiveIntegerField(default=1)
    # ``active`` questions are run (evaluation, replay); ``draft`` ones wait for review (a bulk
    # import row whose evidence matched no chunk well enough). ``match_policy``: a replay passes
    # when ``all`` expected items are found, or ``any`` one (docs/quality.md).
    status = models.CharField(max_length=8, default="active")
    match_policy = models.CharField(max_length=8, default="all")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SpaceScopedQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["space", "created_at"], name="golden_question_space_created")
        ]

    def __str__(self) -> str:
        return self.question[:80]


from retrieval.quality.models import (  # noqa: E402, F401
    BadCase,
    BadCaseEvent,
    FailedQuery,
    ReplayItem,
    ReplayRun,
    TriageRun,
)
from retrieval.research_tasks.models import ResearchTask, ResearchTaskPartial  # noqa: E402, F401
