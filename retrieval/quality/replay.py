"""Durable replay runs of golden questions (``…/quality/replay-runs``, ``kfs quality replay``).

Creation checks the request (1–1,000 active golden question ids of the space, or
``selection: "all-active"``; ``mode`` fast|deep|research, default the profile's), freezes the
snapshot (:func:`freeze`) and the requester's provenance, writes the run and one item per
question (question, expected evidence and match policy copied) in one transaction, and
dispatches it through the jobs kernel after the commit (:mod:`.replay_dispatch`). The same
``Idempotency-Key`` (8–255 characters, per requester) with the same request answers the same run;
with another request it is 409 ``idempotency_key_reused``.

Cancel and retry are compare-and-set on ``revision`` (409 ``revision_conflict``). A retry
resets every item to ``pending``, takes a fresh snapshot and provenance and counts ``attempt``.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, Unavailable
from retrieval.models import GoldenQuestion
from retrieval.recall import CONCRETE_MODES, resolve_snapshot
from spaces.readiness import require_servable

from . import replay_dispatch
from .frozen import freeze_publication
from .models import ReplayItem, ReplayRun
from .scope import one, provenance_of, readable

MAX_IDS = 1000
CREATE_MEMBERS = ("golden_question_ids", "selection", "mode")


def freeze(space) -> dict:
    """The snapshot a run replays on: the publication (revision, time, documents:
    :mod:`.frozen`), the active index version, the embedding model and the retrieval profile.
    503 ``replay_unavailable`` without a dense index or a servable profile."""
    profile = require_servable(space)
    snapshot = resolve_snapshot(space)
    if snapshot.version is None:
        raise Unavailable(
            "this space has no dense index to replay on yet", code="replay_unavailable"
        )
    number, model_id, dimension = snapshot.version
    return {
        "publication_revision": snapshot.head_revision,
        "publication": freeze_publication(space, snapshot.head_revision),
        "index_version": {"number": number, "model_id": model_id, "dimension": dimension},
        "embedding_model": model_id,
        "vector_space_id": profile.vector_space_id or None,
        "retrieval_profile": {
            "revision": profile.retrieval_revision,
            "top_k": profile.retrieval_top_k,
            "default_mode": profile.retrieval_default_mode,
            "reasoning_model": profile.retrieval_reasoning_model,
            "rerank_model": profile.retrieval_rerank_model
            if profile.retrieval_rerank_enabled
            else None,
        },
    }


def _request(space, body) -> tuple[str, str | None, list[GoldenQuestion]]:
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - set(CREATE_MEMBERS))
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a replay-run member (members: {', '.join(CREATE_MEMBERS)})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    mode = body.get("mode")
    if mode is not None and mode not in CONCRETE_MODES:
        raise InvalidInput(
            f"mode must be one of: {', '.join(CONCRETE_MODES)}",
            code="invalid_mode",
            details={"field": "mode"},
        )
    active = GoldenQuestion.objects.filter(space=space, status="active")
    if ("golden_question_ids" in body) == ("selection" in body):
        raise InvalidInput(
            'give exactly one of golden_question_ids or selection: "all-active"',
            code="invalid_request",
            details={"field": "golden_question_ids"},
        )
    if "selection" in body:
        if body["selection"] != "all-active":
            raise InvalidInput(
                'selection must be "all-active"', code="invalid_request",
                details={"field": "selection"},
            )  # fmt: skip
        questions = list(active.order_by("created_at", "id"))
        selection = "all-active"
    else:
        ids = body["golden_question_ids"]
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_IDS:
            too_many = isinstance(ids, list) and len(ids) > MAX_IDS
            raise InvalidInput(
                f"golden_question_ids must list 1 to {MAX_IDS} question ids"
                + (f" ({len(ids)} given)" if isinstance(ids, list) else ""),
                code="too_many_items" if too_many else "invalid_golden_question_ids",
                details={"field": "golden_question_ids", "max": MAX_IDS},
            )
        keys = []
        for n, raw in enumerate(ids):
            try:
                keys.append(uuid.UUID(str(raw)))
            except ValueError:
                raise InvalidInput(
                    f"golden_question_ids[{n}] is not a question id",
                    code="invalid_golden_question_ids",
                    details={"field": f"golden_question_ids[{n}]"},
                ) from None
        keys = list(dict.fromkeys(keys))
        found = {q.id: q for q in active.filter(id__in=keys)}
        missing = [str(k) for k in keys if k not in found]
        if missing:
            raise InvalidInput(
                f"{len(missing)} ids are not active golden questions of this space "
                f"(first: {missing[0]})",
                code="unknown_golden_questions",
                details={"field": "golden_question_ids", "ids": missing[:20]},
            )
        questions = [found[k] for k in keys]
        selection = "ids"
    if not questions:
        raise InvalidInput(
            "this space has no active golden questions to replay", code="no_golden_questions"
        )
    return selection, mode, questions


def _fingerprint(space, selection: str, mode, questions) -> str:
    canonical = json.dumps(
        {"space": str(space.id), "selection": selection, "mode": mode,
         "questions": [str(q.id) for q in questions] if selection == "ids" else None},
        sort_keys=True,
    )  # fmt: skip
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not 8 <= len(key) <= 255 or not key.isprintable():
        raise InvalidInput(
            "Idempotency-Key must be 8 to 255 printable characters",
            code="invalid_idempotency_key",
        )
    return key


def create_run(principal, space, body, *, idempotency_key: str | None = None):
    """``(run, created)``; the run is dispatched after the commit."""
    key = check_idempotency_key(idempotency_key)
    selection, mode, questions = _request(space, body)
    fingerprint = _fingerprint(space, selection, mode, questions)
    provenance = provenance_of(principal)
    if key is not None:
        existing = ReplayRun.objects.filter(
            tenant_id=principal.tenant_id, requester=provenance["requester"], idempotency_key=key
        ).first()
        if existing is not None:
            return same_request(existing, fingerprint), False
    snapshot = freeze(space)
    concrete = mode or snapshot["retrieval_profile"]["default_mode"]
    if concrete not in CONCRETE_MODES:
        concrete = "fast"  # an auto profile: a replay runs one concrete mode
    try:
        with transaction.atomic():
            run = ReplayRun.objects.create(
                **provenance, space=space, mode=concrete, selection=selection,
                frozen_snapshot=snapshot, idempotency_key=key,
                request_fingerprint=fingerprint,
                summary={"total": len(questions), "completed": 0, "passed": 0, "failed": 0},
            )  # fmt: skip
            ReplayItem.objects.bulk_create(
                ReplayItem(
                    run=run,
                    golden_question_id=q.id,
                    ordinal=n,
                    question=q.question,
                    expected_evidence=q.expected_evidence,
                    match_policy=q.match_policy,
                )  # fmt: skip
                for n, q in enumerate(questions, 1)
            )
            replay_dispatch.QUEUE.dispatch_on_commit(run.id)
    except IntegrityError:  # the same key, created concurrently
        existing = ReplayRun.objects.get(
            tenant_id=principal.tenant_id, requester=provenance["requester"], idempotency_key=key
        )
        return same_request(existing, fingerprint), False
    return run, True


def same_request(run, fingerprint: str):
    """``run`` (a replay or triage run) when it was made for the request ``fingerprint``, else
    409 ``idempotency_key_reused``."""
    if run.request_fingerprint != fingerprint:
        raise Conflict(
            "this Idempotency-Key was used for another request",
            code="idempotency_key_reused",
        )
    return run


def get_run(principal, space, ident) -> ReplayRun:
    return one(principal, ReplayRun, space, ident, "replay_run_not_found", "replay run")


def runs(principal, space, params) -> object:
    """The runs of ``space`` the caller may read, filtered by ``mode``, ``state``, ``from``,
    ``to`` (ISO 8601 times of creation)."""
    from django.utils.dateparse import parse_datetime

    rows = readable(principal, ReplayRun.objects.all(), space)
    for name, choices in (("mode", CONCRETE_MODES), ("state", ReplayRun.STATES)):
        value = params.get(name)
        if value is not None:
            if value not in choices:
                raise InvalidInput(
                    f"{name} must be one of: {', '.join(choices)}",
                    code=f"invalid_{name}",
                    details={"field": name},
                )
            rows = rows.filter(**{name: value})
    for name, lookup in (("from", "created_at__gte"), ("to", "created_at__lt")):
        raw = params.get(name)
        if raw is not None:
            moment = parse_datetime(raw)
            if moment is None:
                raise InvalidInput(
                    f"{name} must be an ISO 8601 time", code="invalid_time", details={"field": name}
                )
            rows = rows.filter(**{lookup: moment})
    return rows


def expected_revision(body) -> int:
    value = body.get("expected_revision") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            "expected_revision is required: the run's current revision (an integer ≥ 1)",
            code="invalid_revision",
            details={"field": "expected_revision"},
        )
    return value


def revision_conflict(run, expected: int, kind: str = "replay") -> Conflict:
    """409 ``revision_conflict`` for ``run`` (a replay or triage run) read again."""
    run.refresh_from_db()
    return Conflict(
        f"the {kind} run is at revision {run.revision} ({run.state}), not {expected}",
        code="revision_conflict",
        details={"current_revision": run.revision, "state": run.state},
    )


def cancel_run(run: ReplayRun, body) -> ReplayRun:
    """``queued`` or ``running`` → ``canceled`` (409 ``replay_run_finished`` otherwise)."""
    expected = expected_revision(body)
    if run.state in ReplayRun.TERMINAL:
        raise Conflict(f"the replay run already ended {run.state}", code="replay_run_finished")
    now = timezone.now()
    if not ReplayRun.objects.filter(
        id=run.id, revision=expected, state__in=("queued", "running")
    ).update(
        state="canceled", revision=F("revision") + 1, task_id=None, claimed_at=None,
        step_started_at=None, completed_at=now, updated_at=now,
    ):  # fmt: skip
        raise revision_conflict(run, expected)
    run.refresh_from_db()
    return run


def retry_run(principal, run: ReplayRun, body) -> ReplayRun:
    """A finished run again, on a fresh snapshot and the retrying caller's provenance: every
    item back to ``pending``, ``attempt`` + 1 (409 ``replay_run_active`` while it runs)."""
    expected = expected_revision(body)
    if run.state not in ReplayRun.TERMINAL:
        raise Conflict(f"the replay run is still {run.state}", code="replay_run_active")
    snapshot = freeze(run.space)
    now = timezone.now()
    with transaction.atomic():
        if not ReplayRun.objects.filter(
            id=run.id, revision=expected, state__in=ReplayRun.TERMINAL
        ).update(
            **provenance_of(principal), state="queued", revision=F("revision") + 1,
            attempt=F("attempt") + 1, frozen_snapshot=snapshot, error_code="",
            error_message="", task_id=None, claimed_at=None, step_started_at=None,
            attempt_count=0, started_at=None, completed_at=None, updated_at=now,
            summary={"total": run.items.count(), "completed": 0, "passed": 0, "failed": 0},
        ):  # fmt: skip
            raise revision_conflict(run, expected)
        run.items.update(state="pending", result={}, metrics={}, completed_at=None)
        replay_dispatch.QUEUE.dispatch_on_commit(run.id)
    run.refresh_from_db()
    return run


def as_dict(run: ReplayRun, *, items: bool = True) -> dict:
    snapshot = run.frozen_snapshot or {}
    profile = snapshot.get("retrieval_profile") or {}
    version = snapshot.get("index_version") or {}
    body = {
        "id": str(run.id),
        "space_id": str(run.space_id),
        "mode": run.mode,
        "selection": run.selection,
        "state": run.state,
        "attempt": run.attempt,
        "revision": run.revision,
        "error": {"code": run.error_code, "message": run.error_message} if run.error_code else None,
        "summary": run.summary,
        "provenance": {
            "embedding": {
                "model": snapshot.get("embedding_model"),
                "dimension": version.get("dimension"),
                "vector_space_id": snapshot.get("vector_space_id"),
            },
            "projection": {
                "projection_version": version.get("number"),
                "publication_revision": snapshot.get("publication_revision"),
            },
            "retrieval": {
                "profile_revision": profile.get("revision"),
                "reasoning_model": profile.get("reasoning_model"),
                "rerank_model": profile.get("rerank_model"),
            },
            "requester": run.provenance(),
        },  # fmt: skip
        "request_fingerprint": run.request_fingerprint,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "completed_at": run.completed_at.isoformat() if run.completed_at else None,
    }
    if items:
        body["items"] = [i.as_dict() for i in run.items.order_by("ordinal")]
    return body
