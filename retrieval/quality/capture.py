"""Failed-query capture: after an answer's trace committed and its last event went out, a
failed answer becomes a :class:`~retrieval.quality.models.FailedQuery` row.

Triggers: ``not-enough-evidence`` (the answer finished ``no-retrieval-evidence``) and
``low-confidence`` (it answered, but the best absolute relevance signal of its evidence, the
reranker's score or the raw dense cosine, was under ``KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT``
percent; ``0`` turns the rule off; evidence without such a signal never triggers it). Capture is
best-effort: it runs in ``transaction.on_commit`` (so only for a committed trace), one insert,
and a failure is logged with the trace id and the error's class only. The query text is stored
in the row and never in a log line.
"""

from __future__ import annotations

import hashlib
import logging
from functools import partial

from django.conf import settings
from django.db import IntegrityError, transaction

from retrieval import evidence as ev

from .models import FailedQuery
from .scope import provenance_of

logger = logging.getLogger("knowledgefs.quality")

NOT_ENOUGH = "not-enough-evidence"
LOW_CONFIDENCE = "low-confidence"
USER_FEEDBACK = "user-feedback"


def confidence(bundle) -> float | None:
    """The best absolute relevance signal of the packed evidence (``None``: no item has one)."""
    signals = [signal[1] for item in bundle.items if (signal := ev.relevance(item))]
    return max(signals) if signals else None


def trigger_of(bundle, finish_reason: str) -> tuple[str | None, float | None]:
    """``(trigger, confidence)`` of a finished answer; ``trigger`` ``None``: nothing to capture."""
    best = confidence(bundle)
    if finish_reason == "no-retrieval-evidence":
        return NOT_ENOUGH, best
    threshold = settings.KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT / 100
    if finish_reason == "retrieval-evidence" and best is not None and best < threshold:
        return LOW_CONFIDENCE, best
    return None, best


def after_answer(run, finish_reason: str) -> None:
    """Capture ``run`` (an :class:`~retrieval.answers.state.AnswerRun` whose trace is complete)
    if it failed; never raises."""
    try:
        if run.requester is None:
            return
        trigger, best = trigger_of(run.bundle, finish_reason)
        if trigger is None:
            return
        fields = {
            **provenance_of(run.requester),
            "space_id": run.space.id,
            "trace_id": run.trace.id,
            "trigger": trigger,
            "query": run.query,
            "query_sha256": hashlib.sha256(run.query.encode()).hexdigest(),
            "mode": run.trace.mode,
            "source": run.trace.source,
            "answerability": run.bundle.answerability,
            "confidence": best,
        }
        transaction.on_commit(partial(store, fields), robust=True)
    except Exception as exc:  # noqa: BLE001 - capture never breaks an answer
        logger.warning(
            "failed-query capture of trace %s failed: %s", run.trace_id, type(exc).__name__
        )


def store(fields: dict) -> FailedQuery | None:
    """Insert one failed query (the existing row when the trace and trigger were captured)."""
    try:
        with transaction.atomic():
            row, created = FailedQuery.objects.get_or_create(
                trace_id=fields["trace_id"], trigger=fields["trigger"], defaults=fields
            )
    except IntegrityError:  # a concurrent capture of the same trace and trigger
        return FailedQuery.objects.filter(
            trace_id=fields["trace_id"], trigger=fields["trigger"]
        ).first()
    except Exception as exc:  # noqa: BLE001 - best-effort
        logger.warning(
            "failed-query capture of trace %s failed: %s",
            fields.get("trace_id"),
            type(exc).__name__,
        )
        return None
    if created:
        logger.info("captured failed query %s (%s) of trace %s", row.id, row.trigger, row.trace_id)
    return row
