"""Research mode: several queries for one question, fused fairly, reranked once, judged.

Contract. :func:`run_research` is the one entry point for both interactive requests
(``retrieve(..., mode="research")``) and durable research tasks (``durable=True``). Durable
callers pass ``checkpoint`` (a JSON-serialisable dict the function fills) and
``save_checkpoint`` (called with the updated dict whenever it changes; the task persists it).
The checkpoint holds:

* each finished model call's outcome, keyed by step name (``"planner"``, ``"judge"``,
  ``"supplemental"``), ``{"status": "ok", "output": {…}}`` or ``{"status": "failed", "error":
  <safe error class>}``; a resumed run given the saved ``checkpoint`` repeats no finished model
  call (a failed one included: it spent its budget);
* ``"spent"``: ``{"model_calls", "elapsed_ms"}`` of all deliveries so far, saved before every
  model call (the call counts once started) and with every other save. A resumed run deducts
  both from its budget: the durable 180 s and 3 calls hold across deliveries. A call cut short
  by a cancel left no outcome; it stays charged (``research_model_calls_abandoned``) and is
  asked again only if the call budget still allows. Time a delivery spent after its last save
  is not counted (at most one step);
* ``"rounds"``: ``[{"items", "metrics"}]``, the evidence of each finished retrieval round (its
  ranked items after recall, rerank and threshold, and a few counts), saved as the round ends,
  so a task can show partial evidence before the run ends (a redone round is rewritten).

``should_stop`` is polled between steps and, during a model call, every
:data:`retrieval.reasoning.STOP_POLL_SECONDS` (the call's connection is then shut down); when it
returns ``True`` the run raises :class:`ResearchCanceled`. ``deadline_s`` (the caller's wall
clock left, in seconds) and ``max_model_calls`` can only tighten the policy's budgets.

The steps (docs/retrieval.md, "Research and Auto"):

1. **Plan.** With a reasoning model in the space's retrieval profile, one planner call
   (:data:`retrieval.reasoning.PLAN`: intent, at most 3 sub-queries, evidence dimensions; the
   prompt holds only the question). Without one (the embedded default), or when the call times
   out, fails or answers invalid JSON, :func:`decompose` splits the question locally
   (``research_path: "deterministic"``; a failure also sets ``degraded`` and
   ``degradation_reason``).
2. **Embed** the original query and the planned ones in one batch (``embed_queries``).
3. **Recall** both legs per query at Research depth ``min(max(top_k × 10, 50), 100)`` and fuse
   each query's legs with Fast's min-max fusion (so each per-query list is what Fast would
   rank at that depth).
4. **Weighted-max combination** (:func:`weighted_max`) orders the candidates of all lists:
   a candidate's score is ``max_i w_i × s_i`` over the lists holding it, ``s_i`` being its
   fused (min-max, in [0, 1]) score in list ``i``. Weights (ours, measured on composite SciFact
   questions, docs/benchmarks.md): the original query 1.0, each planned or supplemental query
   0.9, so on a tie the original query's evidence leads. Presence in several lists adds
   nothing: a passage that is the best answer to one part of the question is not outvoted by
   generic passages that sit mid-rank in every list (weighted reciprocal rank fusion with
   ``k = 60`` did exactly that: composite questions ranked worse than Fast). With one query
   the order is exactly that query's fused (Fast) order.
5. **Shared pool**: at most ``KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES`` (200, capped at 200)
   candidates taken round-robin from the per-query lists (original first), so every intent gets
   an equal share.
6. **Rerank** the pool in one call when the profile enables a reranker: its score is the final
   score (the combined order breaks ties and stays as provenance); otherwise the final score
   is the combined score. The threshold applies to the final score, then ``top_k``.
7. **Judge** (durable runs on the reasoning path only): one call over the top evidence (inside
   an untrusted-data block) names which planned evidence dimensions are covered and whether one
   more search would help; the labels must be the planner's own.
8. **Supplemental** (durable only, at most one): one supplemental-planning call writes a single
   query from the question and the missing dimension labels (no document text in that prompt);
   its list (at most ``min(top_k × 5, 100)`` new candidates) joins the pool, new candidates are
   reranked in one more call, and the ranking is redone (``research_rounds: 2``).

Budgets (reference inventory §5.3, Evidence V3): interactive at most 3 model calls, 60 s wall
clock, no judge, no supplemental round; durable at most 3 model calls (planner, judge,
supplemental planning: one each), 180 s over all deliveries; either tightened by the caller's
``deadline_s``/``max_model_calls``. A model call is not started with less than 1 s left of
the wall clock or with the call budget spent; that is reported as ``budget_exhausted``
(``"wall_clock"`` or ``"model_calls"``), never as an error over usable evidence. Each call's own
deadline is ``min(KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS, time left)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import reasoning
from .budget import DURABLE, INTERACTIVE, _Run
from .decompose import decompose
from .images import EXPANSION_CALLS, expand_images
from .prompts import _Plan, _planner_prompt
from .rounds import _Retrieval


def run_research(
    space,
    query: str,
    *,
    top_k: int,
    score_threshold: float | None,
    filters=None,
    durable: bool = False,
    checkpoint: dict | None = None,
    save_checkpoint: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    deadline_s: float | None = None,
    max_model_calls: int | None = None,
    query_images: list[str] | None = None,
    subject: str = "",
):
    """Return a :class:`retrieval.recall.RetrievalResult` with ``mode="research"``.

    ``result.metrics`` carries ``research_model_calls`` (calls this run counts against its
    budget, reused ones included), ``research_model_calls_reused`` (taken from ``checkpoint``),
    ``research_rounds``, ``research_supplemental_searches``, ``research_path``
    (``"reasoning"`` or ``"deterministic"``), ``research_policy`` (``interactive``/``durable``),
    ``budget_exhausted`` (``"model_calls"``, ``"wall_clock"`` or ``None``), ``degraded``,
    ``degradation_reason`` (a safe error class or ``None``), ``rerank_pool``, ``research_lists``
    (per query: ``role``, ``weight``, ``candidates``, ``pool``), ``research_coverage`` (the
    judge's ``covered``/``missing`` dimensions, or ``None``), the usual counts and timings.
    ``result.plan`` holds depth, limits, the queries, intent and evidence dimensions;
    ``result.stages`` one entry per step. Also ``research_model_calls_abandoned`` (calls an
    earlier delivery started and never finished: charged, not repeated unless budget is left)
    and ``research_elapsed_ms`` (wall clock of all deliveries, this one included).

    ``deadline_s`` (seconds of wall clock the caller has left, e.g. a task's ``timeout_ms``)
    and ``max_model_calls`` can only tighten the policy's budget (60 s/180 s, 3 calls); running
    into either is reported as ``budget_exhausted`` like the policy's own. Errors are those of
    ``retrieve``; model failures never raise, they degrade. Raises
    :class:`ResearchCanceled` when ``should_stop()`` answers ``True`` (between steps, or within
    about a second during a model call, whose connection is shut down).

    ``query_images`` (upload file ids, already checked by
    :func:`retrieval.query_images.parse_references`; ``subject`` the caller Dify checks their
    ownership against) are read through one image-to-text expansion
    (:mod:`retrieval.research.images`): with images ``query`` may be empty, the run may make one
    more model call, and ``metrics`` add ``query_images`` and ``degradations``.
    """
    from spaces.readiness import require_ready

    from .. import filters as filtering
    from ..recall import validate_request

    references = list(query_images or [])
    image_only = bool(references) and not (query or "").strip()
    query, top_k, score_threshold, _ = validate_request(
        "image" if image_only else query, top_k, score_threshold, "research"
    )
    query = "" if image_only else query
    filters = filtering.parse(filters)  # 400 before any model call
    total = time.perf_counter()
    policy = DURABLE if durable else INTERACTIVE
    max_calls = policy.max_model_calls + (EXPANSION_CALLS if references else 0)
    if max_model_calls is not None:
        max_calls = max(0, min(max_calls, int(max_model_calls)))
    run = _Run(
        space=space,
        profile=require_ready(space),
        policy=policy,
        checkpoint=checkpoint if checkpoint is not None else {},
        save=save_checkpoint,
        should_stop=should_stop,
        deadline_s=float(deadline_s) if deadline_s is not None else None,
        max_calls=max_calls,
    )
    run.poll()
    t0 = time.perf_counter()
    images = expand_images(run, query, references, subject)
    if references:
        run.stage("image_expansion", "executed" if images.expanded_query else "degraded",
                  len(images.images), t0)  # fmt: skip
    # the images' description is searched with the question (or as it, image-only)
    query = " ".join(p for p in (query, images.expanded_query) if p)
    if not query:  # image-only and no description: nothing to search
        result = _nothing(run, total)
    else:
        selection = reasoning.reasoning_selection(run.profile)
        plan = _plan(run, selection, query)
        run.poll()
        result = _Retrieval(
            run, selection, query, top_k, score_threshold, filters, plan, total
        ).run()
    if references:
        result.metrics["query_images"] = images.describe()
        result.metrics["degradations"] = list(images.degradations)
        result.image_plan = images
    return result


def _nothing(run: _Run, started: float):
    """The result of an image-only run whose images yielded no text (degraded, no items)."""
    from ..recall import RetrievalResult

    metrics = {
        "research_path": "deterministic",
        "research_policy": run.policy.name,
        "research_model_calls": run.calls,
        "research_model_calls_reused": run.calls_reused,
        "research_model_calls_abandoned": run.calls_abandoned,
        "research_elapsed_ms": round((run.prior_elapsed + run.elapsed()) * 1000),
        "research_rounds": 0,
        "budget_exhausted": run.budget_exhausted,
        "degraded": True,
        "degradation_reason": run.degradation_reason,
        "total_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    return RetrievalResult(mode="research", items=[], metrics=metrics, stages=run.stages)


def _plan(run: _Run, selection, query: str) -> _Plan:
    t0 = time.perf_counter()
    if selection is not None:
        output = run.call("planner", selection, _planner_prompt(query))
        if output is not None:
            subs = [q for q in output["sub_queries"] if q.casefold() != query.casefold()]
            run.stage("plan", "executed", 1 + len(subs), t0)
            return _Plan("reasoning", output["intent"], subs, output["evidence_dimensions"])
    subs = decompose(query)
    run.stage("plan", "degraded" if run.degraded else "executed", 1 + len(subs), t0)
    return _Plan("deterministic", None, subs, [])
