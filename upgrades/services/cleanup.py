"""Cleanup authorizations: four-eyes permission to remove a workspace's legacy data.

``requested → approved → started → completed``; each transition is one compare-and-set UPDATE on
(``id``, expected ``status``, expected ``row_version``) that increments ``row_version``. The
approver must not be the requester (403 ``four_eyes_required``, also a check constraint); an
approval lapses after ``KNOWLEDGE_CLEANUP_APPROVAL_SECONDS`` (default 24 h, our choice: long
enough for a maintenance window the next day, short enough that a stale approval cannot start a
cleanup weeks later). A start needs an unexpired approval and a workspace in
``ready_for_cleanup`` with its gate open; in the same transaction it sets the ledger's
``irreversible_cleanup_at`` by one compare-and-set on the ledger (so a rollback is refused from
then on) and records the ledger version that write produced.

Operators are named in 1-150 characters. Refusal codes: docs/upgrades.md, "Cleanup
authorizations".
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import Conflict, Forbidden, InvalidInput, NotFound

from ..models import CleanupAuthorization, CleanupStatus, CutoverPhase, WorkspaceCutoverLedger
from .cutover import StaleVersion, gate_state, get_ledger, mark_irreversible_cleanup

#: Evidence objects are at most this many bytes as JSON.
MAX_EVIDENCE_BYTES = 16 * 1024
#: A request's reason is at most this many characters.
MAX_REASON_CHARS = 2000
OPEN_STATUSES = (CleanupStatus.REQUESTED, CleanupStatus.APPROVED, CleanupStatus.STARTED)


def _operator(name: Any, field: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 150:
        raise InvalidInput(
            f"{field} must name an operator (1-150 characters)", code="invalid_operator"
        )
    return name.strip()


def _evidence(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise InvalidInput(f"{field} must be a non-empty JSON object", code="invalid_evidence")
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > MAX_EVIDENCE_BYTES:
        raise InvalidInput(
            f"{field} is {size} bytes; the limit is {MAX_EVIDENCE_BYTES}", code="invalid_evidence"
        )
    return value


def _reason(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_REASON_CHARS:
        raise InvalidInput(
            f"reason must be text of at most {MAX_REASON_CHARS} characters", code="invalid_reason"
        )
    return value.strip()


def get_authorization(authorization_id: Any) -> CleanupAuthorization:
    """The authorization by id, or 404 ``authorization_not_found``."""
    try:
        key = uuid.UUID(str(authorization_id))
    except ValueError:
        key = None
    found = CleanupAuthorization.objects.filter(id=key).first() if key else None
    if found is None:
        raise NotFound(
            f"cleanup authorization {authorization_id} not found", code="authorization_not_found"
        )
    return found


def _transition(
    authorization: CleanupAuthorization,
    expected_status: str,
    expected_row_version: int,
    values: dict[str, Any],
    now: dt.datetime,
    **where: Any,
) -> CleanupAuthorization:
    """One UPDATE on (id, status, row_version [, extra conditions]); 409 ``stale_version``."""
    changed = CleanupAuthorization.objects.filter(
        id=authorization.id, status=expected_status, row_version=expected_row_version, **where
    ).update(**values, row_version=F("row_version") + 1, updated_at=now)
    if changed != 1:
        current = CleanupAuthorization.objects.get(id=authorization.id)
        raise StaleVersion(
            f"the authorization is now {current.status}, version {current.row_version}",
            details={"status": current.status, "row_version": current.row_version},
        )
    return CleanupAuthorization.objects.get(id=authorization.id)


def _expect(authorization_id: Any, status: str, row_version: int) -> CleanupAuthorization:
    found = get_authorization(authorization_id)
    if found.row_version != row_version:
        raise StaleVersion(
            f"the authorization is at version {found.row_version}, not {row_version}",
            details={"status": found.status, "row_version": found.row_version},
        )
    if found.status != status:
        raise Conflict(f"the authorization is {found.status}, not {status}", code="invalid_status")
    return found


def request_cleanup(
    tenant_id: str, *, requested_by: str, reason: str = "", now: dt.datetime | None = None
) -> CleanupAuthorization:
    """Ask for a cleanup of the tenant's legacy data. The ledger must be ``observing`` or
    ``ready_for_cleanup`` and have no other open authorization (checked under the ledger's row
    lock); ``reason``: at most 2,000 characters. Refusals: docs/upgrades.md."""
    now = now or timezone.now()
    requested_by = _operator(requested_by, "requested_by")
    reason = _reason(reason)
    with transaction.atomic():
        ledger = get_ledger(tenant_id)
        ledger = WorkspaceCutoverLedger.objects.select_for_update().get(id=ledger.id)
        if ledger.phase not in (CutoverPhase.OBSERVING, CutoverPhase.READY_FOR_CLEANUP):
            raise Conflict(
                f"cleanup can be requested in observing or ready_for_cleanup, not {ledger.phase}",
                code="ledger_not_ready",
            )
        open_one = ledger.cleanup_authorizations.filter(status__in=OPEN_STATUSES).first()
        if open_one is not None:
            raise Conflict(
                f"authorization {open_one.id} is still {open_one.status}",
                code="cleanup_already_open",
            )
        return CleanupAuthorization.objects.create(
            tenant_id=ledger.tenant_id,
            ledger=ledger,
            requested_by=requested_by,
            requested_at=now,
            reason=reason,
        )


def approve(
    authorization_id: Any,
    *,
    expected_row_version: int,
    approved_by: str,
    now: dt.datetime | None = None,
) -> CleanupAuthorization:
    """Approve a requested authorization; the approver must differ from the requester (403
    ``four_eyes_required``). The approval expires ``KNOWLEDGE_CLEANUP_APPROVAL_SECONDS`` later."""
    now = now or timezone.now()
    approved_by = _operator(approved_by, "approved_by")
    found = _expect(authorization_id, CleanupStatus.REQUESTED, expected_row_version)
    if approved_by == found.requested_by:
        raise Forbidden(
            f"{approved_by} requested this cleanup; another operator must approve it",
            code="four_eyes_required",
        )
    expires = now + dt.timedelta(seconds=settings.KNOWLEDGE_CLEANUP_APPROVAL_SECONDS)
    values = {"status": CleanupStatus.APPROVED, "approved_by": approved_by, "approved_at": now}
    values["approval_expires_at"] = expires
    return _transition(found, CleanupStatus.REQUESTED, expected_row_version, values, now)


def start(
    authorization_id: Any,
    *,
    expected_row_version: int,
    started_by: str,
    evidence: dict[str, Any],
    now: dt.datetime | None = None,
) -> CleanupAuthorization:
    """Start an approved cleanup while its approval is unexpired (else 409).

    One transaction: the ledger's ``irreversible_cleanup_at`` is set by a compare-and-set on the
    ledger (``ready_for_cleanup``, gate open; else 409), then the
    authorization moves to ``started`` recording the ledger's new version; if the second write
    loses its race the first is rolled back.
    """
    now = now or timezone.now()
    started_by = _operator(started_by, "started_by")
    evidence = _evidence(evidence, "evidence")
    found = _expect(authorization_id, CleanupStatus.APPROVED, expected_row_version)
    expires_at = found.approval_expires_at
    assert expires_at is not None  # an approved authorization has it (check constraint)
    if expires_at <= now:
        raise Conflict(
            f"the approval expired at {expires_at.isoformat()}; request and "
            "approve the cleanup again",
            code="approval_expired",
        )
    with transaction.atomic():
        ledger = WorkspaceCutoverLedger.objects.get(id=found.ledger_id)
        state = gate_state(ledger)
        if ledger.phase != CutoverPhase.READY_FOR_CLEANUP or not state.open:
            raise Conflict(
                f"the workspace is in phase {ledger.phase} ({state.reason}); a cleanup starts "
                "only in ready_for_cleanup with the gate open",
                code="ledger_not_ready",
            )
        ledger = mark_irreversible_cleanup(ledger, now=now)
        values = {
            "status": CleanupStatus.STARTED,
            "started_by": started_by,
            "started_at": now,
            "started_ledger_cas_version": ledger.cas_version,
            "start_evidence": evidence,
        }
        return _transition(
            found,
            CleanupStatus.APPROVED,
            expected_row_version,
            values,
            now,
            approval_expires_at__gt=now,
        )


def complete(
    authorization_id: Any,
    *,
    expected_row_version: int,
    completed_by: str,
    evidence: dict[str, Any],
    now: dt.datetime | None = None,
) -> CleanupAuthorization:
    """Record a started cleanup as done with its evidence (a non-empty object of at most
    16 KiB) and the ledger's current version."""
    now = now or timezone.now()
    completed_by = _operator(completed_by, "completed_by")
    evidence = _evidence(evidence, "evidence")
    found = _expect(authorization_id, CleanupStatus.STARTED, expected_row_version)
    started_at = found.started_at
    assert started_at is not None  # a started authorization has it (check constraint)
    ledger_version = (
        WorkspaceCutoverLedger.objects.filter(id=found.ledger_id)
        .values_list("cas_version", flat=True)
        .get()
    )
    values = {
        "status": CleanupStatus.COMPLETED,
        "completed_by": completed_by,
        "completed_at": max(now, started_at),
        "completion_evidence": evidence,
        "completed_ledger_cas_version": ledger_version,
    }
    return _transition(found, CleanupStatus.STARTED, expected_row_version, values, now)
