"""Project-level records: idempotent request replays and capability grants."""

from __future__ import annotations

from django.db import models


class IdempotencyRecord(models.Model):
    """The outcome of one ``Idempotency-Key`` request, replayed for retries within 24 hours.

    ``fingerprint`` is a SHA-256 of what the request asked for (route, path parameters and
    the meaningful body), so a key reused for a different request is refused. ``status`` is
    ``null`` while the first request is still running.
    """

    owner = models.CharField(max_length=80, help_text="Who made the request: key:<API key id>.")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_per_owner")
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.owner})"


class CapabilityGrant(models.Model):
    """A Dify capability grant seen on an accepted token, or revoked before first use.

    Dify issues each capability token under a ``grant_id`` for one tenant, caller, action and
    resource. The first accepted token records that tuple here (provenance); later tokens of the
    same grant must carry the same tuple, and a revoked grant is refused on the next request.
    A grant revoked before any token was seen has ``action`` empty.
    """

    grant_id = models.CharField(max_length=128, primary_key=True)
    tenant_id = models.CharField(max_length=64, blank=True, db_index=True)
    caller_kind = models.CharField(max_length=32, blank=True)
    subject = models.CharField(max_length=256, blank=True)
    action = models.CharField(max_length=120, blank=True)
    resource_type = models.CharField(max_length=32, blank=True)
    resource_id = models.CharField(max_length=128, blank=True)
    resource_parent_id = models.CharField(max_length=128, blank=True)
    first_seen_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoke_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "-first_seen_at"], name="grant_tenant_seen")]

    def __str__(self) -> str:
        return f"{self.grant_id} ({self.action or 'revoked before use'})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
