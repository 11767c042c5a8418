"""Bad cases: an answer trace an operator marks as wrong, kept with a reason, tags and a
status (``open | replaying | fixed | dismissed``; ``replaying`` needs a replay run id).

A change is a compare-and-set on ``revision`` (``expected_revision``: 409
``revision_conflict`` when stale) and appends one immutable
:class:`~retrieval.quality.models.BadCaseEvent` in the same transaction.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, NotFound
from retrieval.answers.traces import get_trace

from .models import BadCase, BadCaseEvent, FailedQuery
from .scope import one, provenance_of, readable

MAX_REASON = 4000
MAX_TAGS = 50
MAX_TAG_CHARS = 80
CREATE_MEMBERS = ("trace_id", "reason", "tags")
UPDATE_MEMBERS = ("expected_revision", "status", "reason", "replay_run_id", "tags")


def _members(body, allowed: tuple[str, ...]) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a bad-case member (members: {', '.join(allowed)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    return body


def _reason(value) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REASON:
        raise InvalidInput(
            f"reason must be a string of 1 to {MAX_REASON} characters",
            code="invalid_reason",
            details={"field": "reason", "max": MAX_REASON},
        )
    return value


def _tags(value) -> list[str]:
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > MAX_TAGS
        or not all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_CHARS for t in value)
    ):
        raise InvalidInput(
            f"tags must be a list of at most {MAX_TAGS} strings of 1 to {MAX_TAG_CHARS} characters",
            code="invalid_tags",
            details={"field": "tags", "max": MAX_TAGS},
        )
    return list(dict.fromkeys(value))


def _run_id(value) -> uuid.UUID | None:
    if value is None:
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidInput(
            "replay_run_id must be a replay run id (a UUID)",
            code="invalid_replay_run_id",
            details={"field": "replay_run_id"},
        ) from None


def create_bad_case(principal, space, body) -> BadCase:
    """A bad case of the trace ``body.trace_id`` (readable by ``principal`` and of ``space``,
    else 404 ``trace_not_found``), ``status`` ``open``, revision 1, history ``created``."""
    body = _members(body, CREATE_MEMBERS)
    trace = get_trace(principal, body.get("trace_id"))
    if trace.space_id != space.id:
        raise NotFound("answer trace not found", code="trace_not_found")
    reason, tags = _reason(body.get("reason")), _tags(body.get("tags"))
    known = FailedQuery.objects.filter(trace_id=trace.id).exclude(query="").first()
    with transaction.atomic():
        case = BadCase.objects.create(
            **provenance_of(principal),
            space=space,
            trace_id=trace.id,
            query=known.query if known else "",
            reason=reason,
            tags=tags,
        )
        BadCaseEvent.objects.create(
            bad_case=case,
            revision=1,
            action="created",
            actor=case.requester,
            to_status=case.status,
            reason=reason,
        )
    return case


def update_bad_case(principal, case: BadCase, body) -> BadCase:
    """Change ``status``, ``reason``, ``replay_run_id`` or ``tags`` of ``case`` if its revision
    is still ``expected_revision`` (409 ``revision_conflict`` otherwise)."""
    body = _members(body, UPDATE_MEMBERS)
    expected = body.get("expected_revision")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise InvalidInput(
            "expected_revision is required: the bad case's current revision (an integer ≥ 1)",
            code="invalid_revision",
            details={"field": "expected_revision"},
        )
    changes: dict = {}
    status = body.get("status", case.status)
    if status not in BadCase.STATUSES:
        raise InvalidInput(
            f"status must be one of: {', '.join(BadCase.STATUSES)}",
            code="invalid_status",
            details={"field": "status"},
        )
    changes["status"] = status
    if "reason" in body:
        changes["reason"] = _reason(body["reason"])
    if "tags" in body:
        changes["tags"] = _tags(body["tags"])
    run_id = _run_id(body["replay_run_id"]) if "replay_run_id" in body else case.replay_run_id
    if status == "replaying" and run_id is None:
        raise InvalidInput(
            "status replaying needs replay_run_id (the replay run that checks the fix)",
            code="replay_run_required",
            details={"field": "replay_run_id"},
        )
    changes["replay_run_id"] = run_id
    with transaction.atomic():
        updated = BadCase.objects.filter(id=case.id, revision=expected).update(
            **changes, revision=F("revision") + 1, updated_at=timezone.now()
        )
        if not updated:
            current = BadCase.objects.filter(id=case.id).values_list("revision", flat=True)
            raise Conflict(
                f"the bad case is at revision {current.first()}, not {expected}: read it again",
                code="revision_conflict",
                details={"current_revision": current.first(), "expected_revision": expected},
            )
        BadCaseEvent.objects.create(
            bad_case=case,
            revision=expected + 1,
            action="updated",
            actor=principal.owner[:300],
            from_status=case.status,
            to_status=status,
            reason=changes.get("reason", ""),
        )
    case.refresh_from_db()
    return case


def bad_cases(principal, space, status: str | None = None):
    """The bad cases of ``space`` ``principal`` may read, ``status`` filtered (400
    ``invalid_status``)."""
    rows = readable(principal, BadCase.objects.all(), space)
    if status is not None:
        if status not in BadCase.STATUSES:
            raise InvalidInput(
                f"status must be one of: {', '.join(BadCase.STATUSES)}",
                code="invalid_status",
                details={"field": "status"},
            )
        rows = rows.filter(status=status)
    return rows


def get_bad_case(principal, space, ident) -> BadCase:
    """One bad case, or 404 ``bad_case_not_found``."""
    return one(principal, BadCase, space, ident, "bad_case_not_found", "bad case")


def history(case: BadCase) -> list[dict]:
    """The bad case's history, oldest first."""
    return [event.as_dict() for event in case.events.order_by("revision")]
