"""Project-level records: idempotent request replays."""

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
