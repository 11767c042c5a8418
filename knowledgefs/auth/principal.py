"""The authenticated caller as every service function sees it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    """The one resource a capability token was issued for: ``{type, id, parent_id}``.

    ``type`` is ``namespace``, ``knowledge_space`` or a child type (``document``, ``job``,
    ``query``, ``research_task``, ``source``, ``upload_session``) whose ``parent_id`` is the
    knowledge space id.
    """

    type: str
    id: str
    parent_id: str | None = None


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a tenant, and the spaces it may reach (``None`` = all of them).

    ``kind`` is ``api_key`` (a service API key; ``api_key_id`` set), ``capability`` (a Dify
    capability v2 token; ``caller_kind``, ``grant_id``, ``action`` and ``resource`` set) or
    ``operator`` (the command line and in-process callers). ``subject`` identifies the caller
    for rate limits and idempotency records and never contains a secret.
    """

    tenant_id: str
    space_ids: frozenset[uuid.UUID] | None = None
    api_key_id: uuid.UUID | None = None
    kind: str = "operator"
    subject: str = ""
    caller_kind: str | None = None
    grant_id: str | None = None
    action: str | None = None
    resource: Resource | None = None
    is_authenticated: bool = field(default=True, repr=False)

    def can_reach(self, space_id: uuid.UUID) -> bool:
        """True if ``space_id`` is within this caller's scope (the tenant is checked apart)."""
        return self.space_ids is None or space_id in self.space_ids

    @property
    def owner(self) -> str:
        """Stable owner label for per-caller records (idempotency keys, throttles)."""
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}"
        return self.subject or f"{self.kind}:{self.tenant_id}"
