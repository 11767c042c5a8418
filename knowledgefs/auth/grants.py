"""Capability grants: provenance of accepted tokens and revocation.

Every accepted capability token names a ``grant_id``. :func:`admit_grant` records the grant the
first time it is seen, refuses a revoked grant, and refuses a token that reuses a grant for a
different tenant, caller, action or resource (Dify issues a grant for exactly one of each). The
check is one primary-key read per request, so :func:`revoke_grant` takes effect on the next
request in every process, with no cache to expire.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from knowledgefs.models import CapabilityGrant

from .capability import CapabilityClaims, CapabilityError

LAST_SEEN_RESOLUTION = timedelta(minutes=1)


def admit_grant(claims: CapabilityClaims) -> CapabilityGrant:
    """Record or check the grant of a verified token; returns the grant row.

    Raises :class:`CapabilityError` (403) ``grant_revoked`` or ``grant_mismatch``.
    ``last_seen_at`` is written at most once a minute.
    """
    now = timezone.now()
    identity = {
        "tenant_id": claims.namespace_id,
        "caller_kind": claims.caller_kind,
        "subject": claims.subject[:256],
        "action": claims.action,
        "resource_type": claims.resource.type,
        "resource_id": claims.resource.id,
        "resource_parent_id": claims.resource.parent_id or "",
    }
    grant = CapabilityGrant.objects.filter(grant_id=claims.grant_id).first()
    if grant is None:
        try:
            with transaction.atomic():
                grant = CapabilityGrant.objects.create(
                    grant_id=claims.grant_id, first_seen_at=now, last_seen_at=now, **identity
                )
            return grant
        except IntegrityError:  # another request recorded it first
            grant = CapabilityGrant.objects.get(grant_id=claims.grant_id)
    if grant.is_revoked:
        raise CapabilityError("grant_revoked", "this capability grant was revoked", status=403)
    if not grant.action:
        # a row created by a revocation is always revoked; an empty action cannot be admitted
        raise CapabilityError("grant_revoked", "this capability grant was revoked", status=403)
    if any(getattr(grant, name) != value for name, value in identity.items()):
        raise CapabilityError(
            "grant_mismatch",
            "this grant was issued for a different caller, action or resource",
            status=403,
        )
    if grant.last_seen_at is None or now - grant.last_seen_at >= LAST_SEEN_RESOLUTION:
        CapabilityGrant.objects.filter(grant_id=grant.grant_id).update(last_seen_at=now)
    return grant


def revoke_grant(grant_id: str, *, reason: str = "") -> tuple[CapabilityGrant, bool]:
    """Revoke ``grant_id`` for good; returns ``(grant, newly_revoked)``.

    A grant never seen is recorded as revoked, so a token issued under it is refused when it
    arrives. Revoking twice keeps the first revocation time. Effective on the next request.
    """
    now = timezone.now()
    with transaction.atomic():
        grant, _ = CapabilityGrant.objects.select_for_update().get_or_create(grant_id=grant_id)
        if grant.revoked_at is not None:
            return grant, False
        grant.revoked_at = now
        grant.revoke_reason = reason[:200]
        grant.save(update_fields=["revoked_at", "revoke_reason"])
    return grant, True
