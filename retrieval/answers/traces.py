"""The answer trace: one :func:`step` per stage, the :class:`~retrieval.models.AnswerTrace` row
written before generation and completed after it, and reading a trace back (:func:`get_trace`).
A trace holds counts, timings, labels and node ids, never query text or vectors."""

from __future__ import annotations

import hashlib
import time
import uuid
from datetime import UTC, datetime

from django.utils import timezone

from retrieval.models import AnswerTrace
from retrieval.recall import CONCRETE_MODES

from .state import AnswerRun, Requester


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def step(name: str, status: str, started_at: str, ended_at: str | None = None, **metadata) -> dict:
    """One trace step: ``{name, status ok|error|skipped, started_at, ended_at, metadata}``."""
    return {
        "name": name,
        "status": status,
        "started_at": started_at,
        "ended_at": ended_at or started_at,
        "metadata": metadata,
    }


def _trace_fields(run_id, requester: Requester, space, query: str, mode, source: str) -> dict:
    return {
        "id": run_id,
        "tenant_id": requester.tenant_id,
        "space": space,
        "requester_kind": requester.kind,
        "requester": requester.owner[:300],
        "api_key_id": requester.api_key_id,
        "grant_id": requester.grant_id,
        "source": source,
        "requested_mode": mode or "",
        "query_sha256": hashlib.sha256(query.encode()).hexdigest(),
        "query_chars": len(query),
    }


def _failed_trace(run_id, requester, space, query, mode, source, began, exc) -> None:
    AnswerTrace.objects.create(
        **_trace_fields(run_id, requester, space, query, mode, source),
        mode=mode if mode in CONCRETE_MODES else "",
        steps=[step("query.retrieve", "error", began, _now(), error_code=exc.code)],
        error_code=exc.code,
        completed=True,
        completed_at=timezone.now(),
    )


# Text values a trace may copy from the retrieval's metrics and plan: labels, never query text.
_SAFE_TEXT_KEYS = frozenset(
    {
        "query_language",
        "research_path",
        "research_policy",
        "budget_exhausted",
        "degradation_reason",
        "fusion",
    }
)


def _figures(values) -> dict:
    """The numbers, flags and known labels of a retrieval's ``metrics`` or ``plan``: planned
    sub-queries or any other text derived from the query never reach the trace."""
    if not isinstance(values, dict):
        return {}
    return {
        key: value
        for key, value in values.items()
        if value is None
        or isinstance(value, bool | int | float)
        or (key in _SAFE_TEXT_KEYS and isinstance(value, str) and len(value) <= 80)
    }


def _stages(stages) -> list[dict]:
    return [_figures(stage) | {"name": stage.get("name"), "status": stage.get("status")}
            for stage in stages or [] if isinstance(stage, dict)]  # fmt: skip


def _route_step(requested: str | None, result, began: str) -> dict:
    if result.route is not None:
        return step("query.route", "ok", began, **result.route)
    resolver = "explicit" if requested else "profile_default"
    return step(
        "query.route",
        "skipped",
        began,
        requested_mode=requested,
        resolved_mode=result.mode,
        resolver=resolver,
    )


def _retrieve_steps(result, began: str, ended: str, t0: float) -> list[dict]:
    """``query.embed`` (from the retrieval's ``embed_ms``; ``skipped`` when the query was not
    embedded) and ``query.retrieve`` with counts and timings, never texts or vectors."""
    metrics = result.metrics or {}
    embed_ms = metrics.get("embed_ms")
    if embed_ms is None:
        embed = step("query.embed", "skipped", began, reason="no dense leg ran")
    else:
        start_dt = datetime.fromisoformat(began)
        end = start_dt.timestamp() + embed_ms / 1000
        embed = step(
            "query.embed",
            "ok",
            began,
            datetime.fromtimestamp(end, UTC).isoformat(timespec="milliseconds"),
            duration_ms=embed_ms,
        )
    retrieve_meta = {
        "items": len(result.items),
        "duration_ms": round((time.perf_counter() - t0) * 1000, 2),
        "metrics": _figures(metrics),
        "plan": _figures(result.plan),
        "stages": _stages(result.stages),
    }
    return [embed, step("query.retrieve", "ok", began, ended, **retrieve_meta)]


def _complete(run: AnswerRun, generate: dict, *, finish_reason: str = "", error: str = "") -> None:
    run.steps.append(generate)
    AnswerTrace.objects.filter(id=run.trace.id, completed=False).update(
        steps=run.steps,
        answerability=run.bundle.answerability,
        finish_reason=finish_reason,
        error_code=error,
        completed=True,
        completed_at=timezone.now(),
    )


# --- reading traces ----------------------------------------------------------------------------


def get_trace(principal, trace_id) -> AnswerTrace:
    """The trace ``trace_id`` if ``principal`` may read it, else 404 ``trace_not_found``.

    Readable within the trace's tenant, in a space the caller reaches (an API key's bound
    spaces); a trace made with a capability token only by the same subject (the token's
    ``subject``). API keys carry no user identity, so any key of the tenant that reaches the
    space reads the space's traces.
    """
    from knowledgefs.errors import NotFound

    try:
        ident = uuid.UUID(str(trace_id))
    except ValueError:
        raise NotFound("answer trace not found", code="trace_not_found") from None
    traces = AnswerTrace.objects.filter(id=ident, tenant_id=principal.tenant_id)
    if principal.space_ids is not None:
        traces = traces.filter(space_id__in=principal.space_ids)
    trace = traces.first()
    if trace is None or (
        principal.kind == "capability"
        and (trace.requester_kind != "capability" or trace.requester != principal.owner)
    ):
        raise NotFound("answer trace not found", code="trace_not_found")
    return trace
