"""Index projections kept by the portable part of the search backend.

The keyword projection is engine-specific (an FTS5 table on SQLite, a tsvector table on
PostgreSQL) and is created by this app's migrations, not declared as a model. Dense vectors
belong to an :class:`IndexVersion` of their space: one embedding model, one dimension.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from ingestion.models import KnowledgeNode
from spaces.models import KnowledgeSpace


class IndexState(models.TextChoices):
    BUILDING = "building", "Building"
    ACTIVE = "active", "Active"
    RETIRED = "retired", "Retired"


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

    def as_dict(self) -> dict:
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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["space", "created_at"], name="golden_question_space_created")
        ]

    def __str__(self) -> str:
        return self.question[:80]
