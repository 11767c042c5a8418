"""Research task operations for the API, the admin and the command line.

Visibility: a task is found only in the caller's tenant, in a space the caller can reach, and
(for API keys and capability tokens) only by the owner that created it — the key, or the
capability subject (the reference: a research task is read with the credential that started
it). Operators (command line, admin) see every task of the tenant. Anything else is 404
``research_task_not_found``, never 403, so ids of other tenants or owners are not confirmed.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.errors import Conflict, NotFound, ServiceError, TooManyRequests
from knowledgefs.idempotency import KeyReused, fingerprint

from . import dispatch, planning
from .models import (
    LIVE_RUN_STATES,
    ResearchTask,
    ResearchTaskPartial,
    RunState,
    Stage,
)


class LimitsExceeded(ServiceError):
    """422 ``research_limits_exceeded``: the plan cannot meet the task's limits; the body lists
    ``violations`` ``[{limit, limit_value, estimated_value}]`` (reference inventory §3.4)."""

    status = 422
    code = "research_limits_exceeded"

    def __init__(self, violations: list[dict], plan: dict) -> None:
        names = ", ".join(v["limit"] for v in violations)
        super().__init__(f"the research plan cannot meet the limits: {names}")
        self.violations = violations
        self.plan = plan

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "violations": self.violations}


#: ``Retry-After`` of a 429 ``research_task_limit``: a delivery lasts at most 180 s (durable
#: budget), most far less; 30 s is a fair first wait.
LIMIT_RETRY_AFTER = 30


def _require_capacity(principal: Principal) -> None:
    """429 ``research_task_limit`` (``Retry-After: 30``) when the caller's owner already has
    ``KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER`` active (queued or running) tasks, or its
    tenant ``KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT``; the message and ``details`` name
    the limit. Counted before the insert, so concurrent creates may overshoot by their number.
    """
    active = ResearchTask.objects.filter(run_state__in=LIVE_RUN_STATES)
    checks = (
        ("owner", settings.KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER,
         active.filter(tenant_id=principal.tenant_id, owner=principal.owner)),
        ("tenant", settings.KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT,
         active.filter(tenant_id=principal.tenant_id)),
    )  # fmt: skip
    for scope, limit, rows in checks:
        count = rows.count()
        if count >= limit:
            setting = f"KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_{scope.upper()}"
            raise TooManyRequests(
                f"this {'caller' if scope == 'owner' else 'tenant'} has {count} active research "
                f"tasks (queued or running); the limit is {limit} ({setting}); retry when one "
                "has finished",
                retry_after=LIMIT_RETRY_AFTER,
                code="research_task_limit",
                details={"scope": scope, "limit": limit, "active": count},
            )


def _request(space, body: dict) -> tuple[str, int, Any, dict, list[str]]:
    """Validate ``query``, ``top_k``, ``filters``, ``limits`` and ``query_images`` of a plan or
    create body; a ``top_k`` left out is the space's retrieval-profile ``top_k``, at most 50.
    With images ``query`` may be empty (:mod:`retrieval.research.images`: an image-only task
    needs a reasoning model that accepts images, else 400 ``query_image_requires_vision``), and
    ``limits.max_model_calls`` may count the one image-to-text expansion."""
    from retrieval import filters as filtering
    from retrieval.query_images import parse_references
    from retrieval.recall import validate_request
    from retrieval.research.images import EXPANSION_CALLS, require_usable
    from spaces.profiles import profile_of

    references = parse_references(body.get("query_images"))  # 413 for 5 images, before work
    top_k = body.get("top_k")
    if top_k is None:
        top_k = min(profile_of(space).retrieval_top_k, planning.MAX_TOP_K)
    top_k = planning.validate_top_k(top_k)
    raw = body.get("query")
    image_only = bool(references) and (raw is None or (isinstance(raw, str) and not raw.strip()))
    query, _, _, _ = validate_request("image" if image_only else raw, top_k, None, "research")
    query = "" if image_only else query
    filters = body.get("filters")
    filtering.parse(filters)  # 400 invalid_filter, too_many_filter_*: stored as sent
    extra = EXPANSION_CALLS if references else 0
    limits = planning.validate_limits(body.get("limits"), extra_calls=extra)
    require_usable(profile_of(space), query, references)
    return query, top_k, filters, limits, references


def _require_searchable(space):
    """What a retrieval over the space needs, checked at admission and at every delivery: the
    search backend (503), a ``ready`` profile and no pending upgrade reconciliation (409); see
    :func:`retrieval.modes.retrieve`. Returns the ready profile."""
    from retrieval.backends import get_search_backend
    from spaces.readiness import require_servable

    get_search_backend()
    return require_servable(space)


def plan_task(space, body: dict) -> dict:
    """The dry-run estimate of a task with this body (nothing is created); 400 for a bad body.
    Violations are reported in the plan, not raised."""
    query, top_k, _, limits, references = _request(space, body)
    _require_searchable(space)
    return planning.estimate(space, query, top_k=top_k, limits=limits, images=len(references))


def create_task(
    principal: Principal, space, body: dict, *, idempotency_key: str | None = None
) -> tuple[ResearchTask, bool]:
    """Queue a research task; returns ``(task, created)`` and dispatches it after the commit.

    Body: ``query`` (1..``RETRIEVAL_MAX_QUERY_CHARS``; may be empty with ``query_images``,
    ``[{"upload_file_id"}]``, :func:`_request`), ``top_k`` (1..50, default the profile's),
    ``filters`` (:mod:`retrieval.filters`, checked here, handed to Research as sent),
    ``limits`` (see :func:`planning.validate_limits`). With ``idempotency_key`` the tenant's task
    created under that key is returned (``created`` ``False``) when the same owner sent the same
    body; another body or owner is refused. The space must be searchable
    (:func:`_require_searchable`) and the caller within :func:`_require_capacity` (resumes are
    not counted against it).
    """
    query, top_k, filters, limits, references = _request(space, body)
    digest = fingerprint(
        "research_tasks.create", str(space.id), query, str(top_k), repr(filters), repr(limits),
        *(["images", *references] if references else []),
    )  # fmt: skip
    if idempotency_key is not None:
        existing = _by_key(principal, idempotency_key, digest)
        if existing is not None:
            return existing, False
    profile = _require_searchable(space)
    _require_capacity(principal)
    plan = planning.estimate(space, query, top_k=top_k, limits=limits, images=len(references))
    if plan["violations"]:
        raise LimitsExceeded(plan["violations"], plan)
    try:
        with transaction.atomic():
            task = ResearchTask.objects.create(
                tenant_id=principal.tenant_id,
                space=space,
                owner=principal.owner,
                api_key_id=principal.api_key_id,
                subject=principal.subject[:256],
                caller_kind=principal.caller_kind or principal.kind,
                idempotency_key=idempotency_key,
                request_fingerprint=digest,
                query=query,
                top_k=top_k,
                score_threshold=profile.retrieval_score_threshold,
                filters=filters,
                limits=limits,
                plan=plan,
                query_images=[{"upload_file_id": r} for r in references],
            )
            dispatch.dispatch_on_commit(task.id)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = _by_key(principal, idempotency_key, digest)
        if existing is None:
            raise
        return existing, False
    return task, True


def _by_key(principal: Principal, key: str, digest: str) -> ResearchTask | None:
    task = ResearchTask.objects.filter(tenant_id=principal.tenant_id, idempotency_key=key).first()
    if task is None:
        return None
    if task.owner != principal.owner or task.request_fingerprint != digest:
        raise KeyReused("this Idempotency-Key was already used for a different research task")
    return task


def visible_tasks(principal: Principal):
    """The tasks ``principal`` may see (see the module docstring)."""
    tasks = ResearchTask.objects.filter(tenant_id=principal.tenant_id)
    if principal.space_ids is not None:
        tasks = tasks.filter(space_id__in=principal.space_ids)
    if principal.kind != "operator":
        tasks = tasks.filter(owner=principal.owner)
    return tasks


def get_task(principal: Principal, task_id) -> ResearchTask:
    """The task if visible to ``principal``, else 404 ``research_task_not_found``."""
    try:
        task_uuid = uuid.UUID(str(task_id))
    except ValueError:
        raise NotFound("research task not found", code="research_task_not_found") from None
    task = visible_tasks(principal).filter(id=task_uuid).select_related("space").first()
    if task is None:
        raise NotFound("research task not found", code="research_task_not_found")
    return task


def tasks_in(principal: Principal, space):
    """The space's tasks visible to ``principal`` (for keyset pagination, newest first)."""
    return visible_tasks(principal).filter(space=space)


def partials_of(task: ResearchTask):
    """The task's partial evidence in ``sequence`` order."""
    return ResearchTaskPartial.objects.filter(task=task)


def unavailable_documents(bundles) -> dict[str, str]:
    """``{document_id: reason}`` for the documents cited in ``bundles`` (results or partial
    evidence, each ``{"items": [{"citation": {"document_id"}}…]}`` or ``None``) that may no
    longer be served: ``document_disabled`` (the document text route answers 409) or
    ``document_deleted`` (404). One query."""
    from ingestion.models import Document

    cited = {
        str((item.get("citation") or {}).get("document_id"))
        for bundle in bundles
        if isinstance(bundle, dict)
        for item in bundle.get("items") or ()
        if isinstance(item, dict)
    }
    cited.discard("None")
    ids = []
    for value in cited:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue
    enabled = dict(Document.objects.filter(id__in=ids).values_list("id", "enabled"))
    reasons = {}
    for value in cited:
        try:
            state = enabled.get(uuid.UUID(value))
        except ValueError:
            state = None
        if state is None:
            reasons[value] = "document_deleted"
        elif not state:
            reasons[value] = "document_disabled"
    return reasons


def redact(bundle, reasons: dict[str, str]):
    """``bundle`` without the items of documents in ``reasons`` (see
    :func:`unavailable_documents`), listed instead in ``redacted``: ``[{"document_id",
    "reason"}]`` (a document once however many items it had). A task's stored copy is kept:
    re-enabling the document serves its items again."""
    if not isinstance(bundle, dict) or not bundle.get("items"):
        return bundle
    kept, redacted = [], {}
    for item in bundle["items"]:
        doc = str((item.get("citation") or {}).get("document_id"))
        if doc in reasons:
            redacted[doc] = reasons[doc]
        else:
            kept.append(item)
    if not redacted:
        return bundle
    listed = [{"document_id": d, "reason": r} for d, r in sorted(redacted.items())]
    return {**bundle, "items": kept, "redacted": listed}


def cancel_task(task_pk) -> ResearchTask:
    """Cancel a ``queued`` or ``running`` task at once; returns it ``canceled``.

    The claim is cleared in the same compare-and-set, so a queued message is refused when it
    arrives, and a running delivery's next fenced write (checkpoint, partial, result) matches
    nothing; its ``should_stop`` answers ``True`` at the next poll (the runner reads the row at
    most every :data:`retrieval.research_tasks.runner.STOP_POLL_SECONDS`). The checkpoint is
    kept for a resume. 409 ``research_task_finished`` once completed or failed (or already
    canceled).
    """
    now = timezone.now()
    for _ in range(3):
        task = ResearchTask.objects.filter(id=task_pk).first()
        if task is None:
            raise NotFound("research task not found", code="research_task_not_found")
        if task.run_state not in LIVE_RUN_STATES:
            raise Conflict(
                f"research task {task.id} already ended as {task.run_state}; nothing to cancel",
                code="research_task_finished",
            )
        if ResearchTask.objects.filter(
            id=task.id, run_state=task.run_state, task_id=task.task_id
        ).update(
            run_state=RunState.CANCELED,
            stage=Stage.CANCELED,
            task_id=None,
            claimed_at=None,
            step_started_at=None,
            error_code="canceled",
            error_message="canceled by request",
            finished_at=now,
            updated_at=now,
        ):
            task.refresh_from_db()
            return task
    raise Conflict(f"research task {task_pk} kept changing; try again", code="research_task_busy")


def resume_task(task_pk) -> ResearchTask:
    """Queue a ``failed`` or ``canceled`` task again; it resumes from its checkpoint, so no
    finished model call is repeated. Attempts start over; ``resume_count`` grows. Dispatched
    after the commit. A completed or live task is refused (409)."""
    now = timezone.now()
    with transaction.atomic():
        task = ResearchTask.objects.filter(id=task_pk).first()
        if task is None:
            raise NotFound("research task not found", code="research_task_not_found")
        if task.run_state == RunState.COMPLETED:
            raise Conflict(
                f"research task {task.id} already completed", code="research_task_completed"
            )
        if task.run_state in LIVE_RUN_STATES:
            raise Conflict(
                f"research task {task.id} is still {task.run_state}", code="research_task_live"
            )
        if not ResearchTask.objects.filter(id=task.id, run_state=task.run_state).update(
            run_state=RunState.QUEUED,
            stage=Stage.QUEUED,
            task_id=None,
            claimed_at=None,
            step_started_at=None,
            attempt_count=0,
            resume_count=task.resume_count + 1,
            error_code="",
            error_message="",
            finished_at=None,
            updated_at=now,
        ):
            raise Conflict(
                f"research task {task.id} changed meanwhile; try again", code="research_task_busy"
            )
        dispatch.dispatch_on_commit(task.id)
    task.refresh_from_db()
    return task
