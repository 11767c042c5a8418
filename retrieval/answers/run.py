"""One answer's run: :func:`start` retrieves, packs and writes the trace; :func:`events`
generates the answer and yields its events (the contract is :mod:`retrieval.answers`')."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Generator, Iterator

from django.conf import settings

from knowledgefs.dify.errors import DifyError
from knowledgefs.errors import InvalidInput, ServiceError
from knowledgefs.runtime import UnknownEmbeddingModel, get_embedding_model
from retrieval import evidence as ev
from retrieval.models import AnswerTrace
from retrieval.modes import PROFILE, retrieve
from retrieval.quality import capture

from .citations import CitationNormaliser
from .extractive import _extractive_deltas
from .generation import _generator, _llm_deltas, paced
from .state import AnswerRun, Requester
from .traces import (
    _complete,
    _failed_trace,
    _now,
    _retrieve_steps,
    _route_step,
    _trace_fields,
    step,
)
from .window import _window

logger = logging.getLogger("knowledgefs.answers")

NO_EVIDENCE_MESSAGE = (
    "No evidence in this knowledge space answers the question: nothing relevant passed "
    "retrieval and its score threshold."
)
PERMISSION_LIMITED_MESSAGE = (
    "No evidence you may see answers the question: matching content was removed by permissions."
)
FILTERS_MATCHED_NOTHING_MESSAGE = (
    "No evidence answers the question: the request's filters matched no document."
)
UNRELATED_EVIDENCE_MESSAGE = (
    "No evidence in this knowledge space answers the question: the closest passages found are "
    "about something else."
)


SOURCES = ("service_api", "cli", "retrieval_test")
#: The event :func:`events` yields (payload ``{}``) when the model has been silent for
#: ``KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS``; the SSE stream writes it as a comment line.
HEARTBEAT = "heartbeat"


def start(
    requester: Requester,
    space,
    query: str,
    *,
    mode: str | None = None,
    top_k: int | None = None,
    score_threshold=PROFILE,
    filters=None,
    source: str = "service_api",
    query_images=None,
    subject: str = "",
) -> AnswerRun:
    """Retrieve and pack the evidence of one answer and write its trace (``completed=False``).

    Raises what :func:`retrieval.modes.retrieve` raises; a failure after validation (409/503)
    is recorded as a completed trace with a failed ``query.retrieve`` step first, and the error
    carries ``trace_id`` so the view can send ``X-Query-Run-Id``.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    run_id = uuid.uuid4()
    began = _now()
    t0 = time.perf_counter()
    try:
        result = retrieve(
            space,
            query,
            mode=mode,
            top_k=top_k,
            score_threshold=score_threshold,
            filters=filters,
            query_images=query_images,
            subject=subject,
        )
        query = query or ""
    except InvalidInput:
        raise  # a bad request: no run, no trace
    except ServiceError as exc:
        _failed_trace(run_id, requester, space, query, mode, source, began, exc)
        exc.trace_id = str(run_id)
        raise
    retrieved = _now()
    steps = [_route_step(mode, result, began), *_retrieve_steps(result, began, retrieved, t0)]
    if "query_images" in result.metrics:  # ids, digests, sizes, types and degradations only
        images = result.metrics["query_images"]
        status = "error" if images["degradations"] else "ok"
        steps.append(step("query.images", status, began, retrieved, **images))
    generator = _generator(space)
    answered = _now()
    win = _window(space, generator, query)
    items = ev.from_retrieval(result.items, query)
    removed = ev.removals(result)
    bundle = ev.assess(
        ev.pack(items, win),
        query=query,
        removed=removed,
        min_similarity=_dense_floor(space, result),
    )
    steps.append(step("query.answer", "ok", answered, _now(), **bundle.summary()))
    trace = AnswerTrace.objects.create(
        **_trace_fields(run_id, requester, space, query, mode, source),
        mode=result.mode,
        steps=steps,
        evidence_node_ids=[item.node_id for item in bundle.items],
        answerability=bundle.answerability,
    )
    return AnswerRun(
        space, query, result, bundle, generator, trace, steps, removed, requester=requester
    )


def _dense_floor(space, result) -> float:
    """The cosine floor (:func:`retrieval.evidence.dense_floor`) of the model whose index this
    retrieval read: cosines of two models are not on one scale."""
    number = result.metrics.get("index_version")
    model_id = (
        space.index_versions.filter(number=number).values_list("model_id", flat=True).first()
        if number
        else None
    )
    if model_id is None:
        return ev.dense_floor()
    try:
        return ev.dense_floor(get_embedding_model(model_id, space=space))
    except UnknownEmbeddingModel:
        return ev.dense_floor()


# --- events ------------------------------------------------------------------------------------


class GenerationFailed(Exception):
    """The answer could not be written: ``code`` (``answer_generation_failed``,
    ``answer_empty``), ``message``, ``cause`` (the model runtime's code, if any)."""

    def __init__(self, code: str, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.cause = code, message, cause

    def as_dict(self) -> dict:
        body = {"code": self.code, "message": self.message}
        if self.cause:
            body["cause"] = self.cause
        return body


def events(run: AnswerRun) -> Generator[tuple[str, dict], None, None]:
    """Generate the answer of ``run``: ``("answer.delta", {delta, trace_id})``… then
    ``("answer.done", {...})`` or ``("answer.error", {error {code, message}, trace_id})``;
    between deltas, ``(HEARTBEAT, {})`` whenever the model has been silent for
    ``KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS``.

    The trace is completed before the last event is yielded. A consumer that stops early (the
    client went away) completes it with ``error_code`` ``client_disconnected``; an unexpected
    failure ends the stream with ``answer.error`` ``answer_internal_error`` (and is re-raised
    nowhere: the response has started).
    """
    finished = False
    try:
        if not run.bundle.items or run.bundle.answerability == ev.NOT_ENOUGH:
            yield from _no_evidence(run)
            finished = True
            capture.after_answer(run, "no-retrieval-evidence")  # after the last event
            return
        normaliser = CitationNormaliser(
            {item.label for item in run.bundle.items}, settings.KNOWLEDGE_ANSWER_MAX_BYTES
        )
        started = _now()
        try:
            for delta in _deltas(run, normaliser):
                if delta is None:  # the model is silent: keep the stream open
                    yield HEARTBEAT, {}
                    continue
                yield "answer.delta", {"delta": delta, "trace_id": run.trace_id}
            if not normaliser.answer.strip():
                raise GenerationFailed(
                    "answer_empty",
                    "the model answered no text (or only markers of no evidence)"
                    if run.generator.kind == "llm"
                    else "no sentence of the evidence could be extracted",
                )
        except GenerationFailed as failure:
            meta = _generate_meta(run, normaliser, error=failure.as_dict())
            _complete(
                run, step("query.generate", "error", started, _now(), **meta), error=failure.code
            )
            finished = True
            yield "answer.error", {"error": failure.as_dict(), "trace_id": run.trace_id}
            return
        meta = _generate_meta(run, normaliser)
        done = _done(run, normaliser.answer, normaliser, "retrieval-evidence")
        _complete(
            run,
            step("query.generate", "ok", started, _now(), **meta),
            finish_reason="retrieval-evidence",
        )
        finished = True
        yield "answer.done", done
        capture.after_answer(run, "retrieval-evidence")  # after the last event
    except GeneratorExit:
        if not finished:
            _complete(
                run,
                step("query.generate", "error", _now(), error_code="client_disconnected"),
                error="client_disconnected",
            )
        raise
    except Exception:
        logger.exception("answer run %s failed", run.trace_id)
        if finished:
            return
        error = {"code": "answer_internal_error", "message": "the answer could not be completed"}
        _complete(run, step("query.generate", "error", _now(), error=error), error=error["code"])
        yield "answer.error", {"error": error, "trace_id": run.trace_id}


def _no_evidence(run: AnswerRun) -> Iterator[tuple[str, dict]]:
    """The explicit answer when no evidence was packed, or the packed evidence is about
    something else (``not-enough-evidence``): one delta with the message, then ``answer.done``
    with ``finish_reason`` ``no-retrieval-evidence``, no citations, and the evidence found (if
    any) listed for the record. No model is called."""
    message = no_evidence_message(run.bundle)
    yield "answer.delta", {"delta": message, "trace_id": run.trace_id}
    reason = "unrelated evidence" if run.bundle.items else "no evidence"
    generate = step("query.generate", "skipped", _now(), reason=reason)
    done = _done(run, message, None, "no-retrieval-evidence")
    _complete(run, generate, finish_reason="no-retrieval-evidence")
    yield "answer.done", done


def no_evidence_message(bundle: ev.Bundle) -> str:
    """The explicit answer of a bundle that answers nothing: permissions removed the matches,
    the request's own filters matched no document, the evidence is about something else, or
    nothing passed retrieval."""
    if bundle.answerability == ev.PERMISSION_LIMITED:
        return PERMISSION_LIMITED_MESSAGE
    if bundle.filters_matched_nothing and not bundle.items:
        return FILTERS_MATCHED_NOTHING_MESSAGE
    if bundle.items:
        return UNRELATED_EVIDENCE_MESSAGE
    return NO_EVIDENCE_MESSAGE


def _deltas(run: AnswerRun, normaliser: CitationNormaliser) -> Iterator[str | None]:
    """Normalised deltas; ``None`` when the model has been silent for
    ``KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS`` (the caller sends a heartbeat)."""
    source: Generator[str | None, None, None] | None = None
    try:
        if run.generator.kind == "llm":
            source = paced(_llm_deltas(run), settings.KNOWLEDGE_ANSWER_HEARTBEAT_SECONDS)
        else:
            source = _extractive_deltas(run)
        for piece in source:
            if piece is None:
                yield None
                continue
            out = normaliser.feed(piece)
            if out:
                yield out
            if normaliser.truncated:
                break
        out = normaliser.flush()
        if out:
            yield out
    except DifyError as exc:
        raise GenerationFailed(
            "answer_generation_failed",
            f"the reasoning model {run.generator.model} failed ({exc.code}): {exc.message}",
            cause=exc.code,
        ) from None
    except ServiceError as exc:  # the runtime is not available (capability_unavailable)
        raise GenerationFailed("answer_generation_failed", exc.message, cause=exc.code) from None
    finally:
        if source is not None:
            source.close()


def _generate_meta(run: AnswerRun, normaliser: CitationNormaliser, error=None) -> dict:
    meta = {
        "generator": run.generator.kind,
        "model": run.generator.model,
        "answer_bytes": normaliser.size,
        "citations": len(normaliser.cited),
        "orphan_markers": normaliser.orphans,
        "truncated": normaliser.truncated,
    }
    if error is not None:
        meta["error"] = error
    return meta


def _done(run: AnswerRun, answer: str, normaliser, finish_reason: str) -> dict:
    by_marker = run.bundle.by_marker()
    cited = normaliser.cited if normaliser is not None else []
    payload = {
        "finish_reason": finish_reason,
        "answer": answer,
        "answerability": run.bundle.answerability,
        "answerability_reasons": run.bundle.reasons,
        "citations": [{"marker": m, "citation": by_marker[m].citation} for m in cited],
        "evidence": [
            {
                "marker": item.label,
                "node_id": item.node_id,
                "text": item.text,
                "citation": item.citation,
                "score": round(item.score, 6),
                "conflicts": item.conflicts,
            }
            for item in run.bundle.items
        ],
        "omitted": run.bundle.omitted,
        "orphan_markers": normaliser.orphans if normaliser is not None else [],
        "truncated": normaliser.truncated if normaliser is not None else False,
        "generator": run.generator.kind,
        "mode": run.result.mode,
        "trace_id": run.trace_id,
    }
    if run.result.route is not None:
        payload["route"] = run.result.route
    return payload


def answer(run: AnswerRun) -> tuple[str, dict]:
    """Run :func:`events` to the end; returns the last event ``(name, payload)``."""
    outcome: tuple[str, dict] = ("answer.error", {})
    for event in events(run):
        if event[0] != HEARTBEAT:
            outcome = event
    return outcome
