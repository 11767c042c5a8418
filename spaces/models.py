"""Knowledge spaces, publication heads and tenant-bound API keys."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

SLUG_PATTERN = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"


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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "slug"], name="space_slug_unique_per_tenant"
            )
        ]
        indexes = [models.Index(fields=["tenant_id", "-created_at"], name="space_tenant_created")]

    def __str__(self) -> str:
        return f"{self.slug} ({self.tenant_id})"


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

    def __str__(self) -> str:
        return f"head r{self.revision} of {self.space_id}"


class ApiKey(models.Model):
    """A tenant-bound service API key, stored as a SHA-256 hash with a visible prefix.

    An unscoped key reaches every space of its tenant. A scoped key (``scoped``, fixed at
    creation) reaches only the spaces it is bound to and cannot create new ones; losing its last
    binding never widens it (deleting a space deletes the keys bound only to it). The secret is
    shown once, at creation.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64, db_index=True)
    name = models.CharField(max_length=120, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    scoped = models.BooleanField(
        default=False, help_text="Reaches only its bound spaces; never widens when they go."
    )
    spaces = models.ManyToManyField(KnowledgeSpace, blank=True, related_name="api_keys")
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
