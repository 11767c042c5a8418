"""Knowledge spaces, publication heads and tenant-bound API keys."""

from __future__ import annotations

import re
import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from knowledgefs.errors import InvalidInput

SLUG_PATTERN = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def validate_tenant_id(tenant_id: str) -> str:
    """Return ``tenant_id`` or raise :class:`InvalidInput` (1–64 of ``A-Za-z0-9_.:-``)."""
    if not isinstance(tenant_id, str) or not _TENANT_RE.fullmatch(tenant_id):
        raise InvalidInput(
            "tenant must be 1-64 characters of letters, digits, '_', '.', ':' or '-'",
            code="invalid_tenant",
        )
    return tenant_id


class KnowledgeSpace(models.Model):
    """A tenant's collection of documents, searched as one corpus.

    ``revision`` grows by one on every update so that clients can compare-and-set (PATCH with
    ``revision``). ``embedding_model_id`` and ``embedding_dimension`` are frozen by the first
    document admitted: every vector of the space belongs to that model.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64, db_index=True)
    name = models.CharField(max_length=160)
    slug = models.CharField(max_length=160)
    description = models.TextField(blank=True, default="", max_length=2000)
    revision = models.PositiveIntegerField(default=1)
    embedding_model_id = models.CharField(max_length=200, blank=True, default="")
    embedding_dimension = models.PositiveIntegerField(null=True, blank=True)
    # ``{"chunk_size_tokens", "chunk_overlap_tokens"}`` or null (the deployment's chunking):
    # checked by spaces.services.checked_chunking, read by the compiler for new compilations.
    chunking = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Set when a deletion starts (the purge of a large space takes several transactions); such
    # a space can no longer be bound to an API key.
    deleting_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "slug"], name="space_slug_unique_per_tenant"
            )
        ]
        indexes = [models.Index(fields=["tenant_id", "-created_at"], name="space_tenant_created")]

    def __str__(self) -> str:
        return f"{self.slug} ({self.tenant_id})"


class PublicationHeadManager(models.Manager["PublicationHead"]):
    """Moves a space's publication head (the only writer of ``revision``)."""

    def advance(self, space_id: uuid.UUID, attempts: int = 20) -> int:
        """Move the space's publication head by one compare-and-set; returns the new revision."""
        for _ in range(attempts):
            head, _ = self.get_or_create(space_id=space_id)
            if self.filter(space_id=space_id, revision=head.revision).update(
                revision=head.revision + 1, published_at=timezone.now()
            ):
                return int(head.revision) + 1
        raise RuntimeError(f"publication head of space {space_id} kept moving; gave up")


class PublicationHead(models.Model):
    """The one mutable pointer per space that makes compiled documents visible.

    Publishing moves ``revision`` forward by a single compare-and-set in the same transaction that
    switches a document to its new node generation, so a query sees either the whole old
    generation or the whole new one. Caches of derived indexes are keyed by ``revision``.
    """

    space = models.OneToOneField(
        KnowledgeSpace, on_delete=models.CASCADE, primary_key=True, related_name="publication_head"
    )
    revision = models.PositiveBigIntegerField(default=0)
    published_at = models.DateTimeField(null=True, blank=True)

    objects = PublicationHeadManager()

    def __str__(self) -> str:
        return f"head r{self.revision} of {self.space_id}"


class Readiness(models.TextChoices):
    """Whether a space can admit documents and answer queries (its profiles' activation)."""

    SETUP_REQUIRED = "setup-required", "Setup required"
    PENDING_VALIDATION = "pending-validation", "Pending validation"
    VALIDATION_FAILED = "validation-failed", "Validation failed"
    READY = "ready", "Ready"


class RetrievalMode(models.TextChoices):
    """Retrieval modes a request or a profile may name; only the :meth:`concrete` ones are
    accepted as ``default_mode`` (Auto resolves to one of them: ``mode_unavailable``)."""

    FAST = "fast", "Fast"
    DEEP = "deep", "Deep"
    RESEARCH = "research", "Research"
    AUTO = "auto", "Auto"

    @classmethod
    def all(cls) -> tuple[str, ...]:
        """Every mode's value, in declaration order."""
        return tuple(cls.values)

    @classmethod
    def concrete(cls) -> tuple[str, ...]:
        """The modes that run as themselves (every mode but Auto), in declaration order."""
        return tuple(mode for mode in cls.values if mode != cls.AUTO)


class SpaceProfile(models.Model):
    """A space's embedding profile, retrieval profile and readiness (one row per space).

    **Embedding profile.** The selection ``embedding_plugin_id`` / ``embedding_provider`` /
    ``embedding_model`` is all a client sets. ``embedding_identity`` (the install identity the
    catalog reported: Dify's ``plugin_unique_identifier``, or the registered model id for a local
    model) and ``embedding_dimension`` are observed by the preflight from a real answer, never
    configured. ``vector_space_id`` (``embedding-space-sha256:<hex>``) is derived from the
    selection and that identity; vectors of two vector spaces never share an index.
    ``embedding_frozen_at`` is a latch set when the first document is admitted; after it the
    selection cannot change (a new model needs a new index version).

    **Retrieval profile.** ``retrieval_default_mode``, ``retrieval_reasoning_model`` and
    ``retrieval_rerank_model`` (selections ``{plugin_id, provider, model}`` or null),
    ``retrieval_rerank_enabled``, ``retrieval_score_threshold`` (null = off, else 0..1) and
    ``retrieval_top_k`` (1..100).

    **Readiness** (``state``): ``setup-required`` (no embedding selection), ``pending-validation``
    (selected, the preflight has not passed yet), ``validation-failed`` (the preflight failed for
    good; ``failure`` says why), ``ready``. ``failure`` is the last failed validation
    ``{code, message, field, retryable, failed_at}``, kept until one succeeds.

    Each profile has its own ``revision`` (compare-and-set by ``PUT`` with ``revision``). Rows are
    written only by :mod:`spaces.profiles`, under the space's row lock then this row's.
    """

    space = models.OneToOneField(
        KnowledgeSpace, on_delete=models.CASCADE, primary_key=True, related_name="profile"
    )
    embedding_plugin_id = models.CharField(max_length=256, blank=True, default="")
    embedding_provider = models.CharField(max_length=256, blank=True, default="")
    embedding_model = models.CharField(max_length=256, blank=True, default="")
    embedding_identity = models.CharField(max_length=1024, blank=True, default="")
    embedding_dimension = models.PositiveIntegerField(null=True, blank=True)
    vector_space_id = models.CharField(max_length=96, blank=True, default="")
    embedding_revision = models.PositiveIntegerField(default=1)
    embedding_frozen_at = models.DateTimeField(null=True, blank=True)

    retrieval_default_mode = models.CharField(
        max_length=16, choices=RetrievalMode.choices, default=RetrievalMode.FAST
    )
    retrieval_reasoning_model = models.JSONField(null=True, blank=True)
    retrieval_rerank_enabled = models.BooleanField(default=False)
    retrieval_rerank_model = models.JSONField(null=True, blank=True)
    retrieval_score_threshold = models.FloatField(null=True, blank=True)
    retrieval_top_k = models.PositiveSmallIntegerField(default=10)
    retrieval_revision = models.PositiveIntegerField(default=1)

    state = models.CharField(
        max_length=32, choices=Readiness.choices, default=Readiness.SETUP_REQUIRED
    )
    failure = models.JSONField(null=True, blank=True)
    # What the last successful preflight observed per model: {"embedding": {...}, "rerank": ...}.
    capabilities = models.JSONField(default=dict, blank=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "space profile"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in Readiness]),
                name="space_profile_state",
            ),
            models.CheckConstraint(
                condition=Q(retrieval_top_k__gte=1, retrieval_top_k__lte=100),
                name="space_profile_top_k",
            ),
            models.CheckConstraint(
                condition=Q(retrieval_score_threshold__isnull=True)
                | Q(retrieval_score_threshold__gte=0, retrieval_score_threshold__lte=1),
                name="space_profile_score_threshold",
            ),
            models.CheckConstraint(
                condition=~Q(retrieval_rerank_enabled=True)
                | Q(retrieval_rerank_model__isnull=False),
                name="space_profile_rerank_model",
            ),
        ]
        indexes = [models.Index(fields=["state"], name="space_profile_state_idx")]

    def __str__(self) -> str:
        return f"profile of {self.space_id} ({self.state})"


class ApiKey(models.Model):
    """A tenant-bound service API key, stored as a SHA-256 hash with a visible prefix.

    Its scope is its :class:`ApiKeyBinding` rows: a key with **no** bindings reaches every space
    of its tenant; a key with bindings reaches exactly the bound resources, and each API surface
    honours only bindings of its own kind (this service's routes read ``knowledge_fs_space``
    bindings, so a key bound only to Dify datasets reaches no space here). A key never widens:
    removing its last binding revokes it in the same transaction, and deleting a space deletes
    the keys bound only to it (``spaces.services``). The secret is shown once, at creation.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64, db_index=True)
    name = models.CharField(max_length=120, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        indexes = [
            models.Index(
                fields=["tenant_id"], condition=Q(revoked_at__isnull=True), name="apikey_live"
            )
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant_id})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class BindingType(models.TextChoices):
    """What an :class:`ApiKeyBinding` points at."""

    KNOWLEDGE_FS_SPACE = "knowledge_fs_space", "Knowledge space"
    DATASET = "dataset", "Dify dataset"


class ApiKeyBinding(models.Model):
    """One resource an API key is restricted to: a knowledge space here, or a classic Dify
    Dataset (by id; the Dataset lives on Dify's side and is honoured by Dify's dataset API).

    Exactly one target is set, matching ``resource_type`` (check constraint
    ``apikey_binding_target``). A key is bound to a resource at most once. The uniqueness
    constraints are plain (not conditional): SQLite, PostgreSQL and MySQL/MariaDB all treat NULLs
    as distinct in a unique index, so the rows of the other type never collide, and Django does
    not create conditional unique constraints on MySQL/MariaDB at all.
    """

    id = models.BigAutoField(primary_key=True)
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="bindings")
    resource_type = models.CharField(max_length=32, choices=BindingType.choices)
    space = models.ForeignKey(
        KnowledgeSpace,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="api_key_bindings",
    )
    dataset_id = models.CharField(max_length=64, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "API key binding"
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(
                        resource_type=BindingType.KNOWLEDGE_FS_SPACE,
                        space__isnull=False,
                        dataset_id__isnull=True,
                    )
                    | (
                        Q(
                            resource_type=BindingType.DATASET,
                            space__isnull=True,
                            dataset_id__isnull=False,
                        )
                        & ~Q(dataset_id="")
                    )
                ),
                name="apikey_binding_target",
                violation_error_message=(
                    "a knowledge-space binding names a space and no dataset; a dataset binding "
                    "names a dataset id and no space"
                ),
            ),
            models.UniqueConstraint(
                fields=["api_key", "space"],
                name="apikey_binding_space_unique",
                violation_error_message="the key is already bound to this space",
            ),
            models.UniqueConstraint(
                fields=["api_key", "dataset_id"],
                name="apikey_binding_dataset_unique",
                violation_error_message="the key is already bound to this dataset",
            ),
        ]
        indexes = [models.Index(fields=["dataset_id"], name="apikey_binding_dataset")]

    def __str__(self) -> str:
        if self.resource_type == BindingType.KNOWLEDGE_FS_SPACE:
            return f"space {self.space_id}"
        return f"dataset {self.dataset_id}"
