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

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from . import reasoning

STEPS = ("planner", "judge", "supplemental")
ROUNDS_KEY = "rounds"
"""Checkpoint member: the evidence of each finished retrieval round, ``[{items, metrics}]``."""
SPENT_KEY = "spent"
"""Checkpoint member: ``{"model_calls", "elapsed_ms"}`` spent by all deliveries so far."""
PLANNER_VERSION = "retrieval-planner-v2"  # v1's figures plus Research's queries (inventory §5.2)
COMBINATION = "weighted-max"
ORIGINAL_WEIGHT = 1.0
PLANNED_WEIGHT = 0.9  # ours: bench/scifact_pairs.py, docs/benchmarks.md (0.9 vs 1.0 and 0.5)
MAX_POOL = 200  # seed deployment guide: KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES is capped at 200
MIN_CALL_SECONDS = 1.0
JUDGE_MAX_ITEMS = 10
JUDGE_MAX_ITEM_CHARS = 2000


class ResearchCanceled(Exception):
    """Raised when ``should_stop()`` answered ``True`` (between steps, or during a model call)."""


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Policy:
    """A run's budget (reference inventory §5.3, Research Evidence V3 policies)."""

    name: str
    max_model_calls: int
    wall_clock_seconds: float
    max_supplements: int
    judge: bool


INTERACTIVE = Policy("interactive", 3, 60.0, 0, False)
DURABLE = Policy("durable", 3, 180.0, 1, True)


# --- local decomposition (the deterministic path) ------------------------------------------------

_QUESTION_BREAK = re.compile(r"(?<=[?？])\s*|[;；\n]+")
_CLAUSE_AND = re.compile(
    r"\s*,?\s+and\s+(?=(?:what|how|why|when|where|which|who|whom|whose|is|are|was|were|does|do|"
    r"did|can|could|should|would|will|has|have)\b)",
    re.IGNORECASE,
)
_VERSUS = re.compile(r"\s+(?:vs\.?|versus)\s+", re.IGNORECASE)
_BETWEEN = re.compile(r"\bdifferences?\s+between\s+(.+?)\s+and\s+(.+)$", re.IGNORECASE)
_COMPARE = re.compile(r"^\s*compare\s+(.+?)\s+(?:and|with|to)\s+(.+)$", re.IGNORECASE)
_WORD = re.compile(r"\w{2,}")


def decompose(query: str, limit: int = reasoning.MAX_SUB_QUERIES) -> list[str]:
    """Split a compound question into at most ``limit`` sub-queries; ``[]`` for a simple one.

    The rule, applied in order: (1) break on ``?``/``？`` (after it), ``;``/``；`` and line
    breaks; (2) inside each piece, break on ``and`` (or ``, and``) followed by a question word
    or an auxiliary verb (``what``, ``how``, ``why``, ``is``, ``does``, ``can``…: the start of
    a new clause, not a noun phrase like "salt and pepper"); (3) a comparison becomes its two
    sides: ``X vs Y`` / ``X versus Y``, ``compare X and|with|to Y``, ``difference(s) between X
    and Y``. Pieces without a word of two or more characters are dropped, duplicates (case
    ignored) too. Fewer than two pieces means no sub-queries; more than ``limit`` keeps the
    first ``limit``.
    """
    pieces: list[str] = []
    for part in _QUESTION_BREAK.split(query):
        for clause in _CLAUSE_AND.split(part):
            pieces.extend(_comparison(clause) or [clause])
    seen: set[str] = set()
    result: list[str] = []
    for piece in pieces:
        text = " ".join(piece.strip(" ,.").split())
        key = text.casefold()
        if not _WORD.search(text) or key in seen:
            continue
        seen.add(key)
        result.append(text)
    if len(result) < 2:
        return []
    return result[:limit]


def _comparison(clause: str) -> list[str] | None:
    sides = _VERSUS.split(clause.strip().rstrip("?？. "))
    if len(sides) >= 2:
        return sides
    for pattern in (_COMPARE, _BETWEEN):
        match = pattern.search(clause.strip().rstrip("?？. "))
        if match:
            return [match.group(1), match.group(2)]
    return None


# --- fusion across queries -----------------------------------------------------------------------


Ranked = list[tuple[uuid.UUID, float, dict]]


def weighted_max(lists: list[Ranked], weights: list[float]) -> Ranked:
    """Combine ranked lists (best first, scores in [0, 1]) by weighted maximum.

    A candidate's score is ``max_i weights[i] × score_i`` over the lists holding it (so it
    stays in [0, 1]); being in several lists adds nothing. Ties go to the better rank in the
    first list (the original query), then the better rank in any list, then the node id.
    Each result's ``per_leg`` is the dense/keyword scores of the list that gave its score plus
    ``research`` (the combined score). With one list of weight 1 the order and the scores are
    that list's.
    """
    best: dict[uuid.UUID, tuple[float, dict]] = {}
    first_rank: dict[uuid.UUID, int] = {}
    any_rank: dict[uuid.UUID, int] = {}
    for index, (ranked, weight) in enumerate(zip(lists, weights, strict=True)):
        for rank, (node_id, score, per_leg) in enumerate(ranked, 1):
            value = weight * score
            if node_id not in best or value > best[node_id][0]:
                best[node_id] = (value, per_leg)
            any_rank[node_id] = min(rank, any_rank.get(node_id, rank))
            if index == 0:
                first_rank[node_id] = rank
    combined = [
        (node_id, value, {**per_leg, "research": value})
        for node_id, (value, per_leg) in best.items()
    ]
    combined.sort(key=lambda r: (-r[1], first_rank.get(r[0], 1 << 30), any_rank[r[0]], str(r[0])))
    return combined


def shared_pool(lists: list[Ranked], cap: int) -> tuple[list[uuid.UUID], list[int]]:
    """Take at most ``cap`` distinct candidates round-robin from ``lists`` (each best first).

    Returns the pool (in selection order) and how many candidates each list contributed: every
    list gets a turn in order, a candidate already taken is skipped, an exhausted list gives its
    turn away, so the shares differ by at most one unless a list runs out.
    """
    pool: list[uuid.UUID] = []
    taken: set[uuid.UUID] = set()
    counts = [0] * len(lists)
    cursors = [0] * len(lists)
    while len(pool) < cap:
        progressed = False
        for index, ranked in enumerate(lists):
            if len(pool) >= cap:
                break
            while cursors[index] < len(ranked) and ranked[cursors[index]][0] in taken:
                cursors[index] += 1
            if cursors[index] < len(ranked):
                node_id = ranked[cursors[index]][0]
                cursors[index] += 1
                taken.add(node_id)
                pool.append(node_id)
                counts[index] += 1
                progressed = True
        if not progressed:
            break
    return pool, counts


# --- the run ---------------------------------------------------------------------------------


@dataclass
class _Query:
    text: str
    role: str  # original | planned | supplemental
    weight: float
    ranked: Ranked = field(default_factory=list)
    dense: int = 0
    keyword: int = 0


@dataclass
class _Run:
    space: object
    profile: object
    policy: Policy
    checkpoint: dict
    save: Callable[[dict], None] | None
    should_stop: Callable[[], bool] | None
    deadline_s: float | None = None
    max_calls: int = 0
    started: float = field(default_factory=time.monotonic)
    prior_elapsed: float = 0.0
    prior_calls: int = 0
    calls: int = 0
    calls_reused: int = 0
    calls_abandoned: int = 0
    budget_exhausted: str | None = None
    degraded: bool = False
    degradation_reason: str | None = None
    stages: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Charge what earlier deliveries spent (the checkpoint's ``spent``): their wall clock,
        and the model calls they started that left no outcome (cut short by a cancel)."""
        spent = self.checkpoint.get(SPENT_KEY)
        spent = spent if isinstance(spent, dict) else {}
        self.prior_elapsed = max(0, _int(spent.get("elapsed_ms"))) / 1000
        self.prior_calls = max(0, _int(spent.get("model_calls")))
        recorded = sum(
            1
            for step in STEPS
            if isinstance(self.checkpoint.get(step), dict)
            and self.checkpoint[step].get("status") in ("ok", "failed")
        )
        self.calls_abandoned = max(0, self.prior_calls - recorded)
        self.calls = self.calls_abandoned

    def elapsed(self) -> float:
        """Seconds of this run (this delivery)."""
        return time.monotonic() - self.started

    def remaining(self) -> float:
        """Seconds left: the policy's wall clock less earlier deliveries' and this run's time,
        and never past the caller's ``deadline_s``."""
        elapsed = self.elapsed()
        left = self.policy.wall_clock_seconds - self.prior_elapsed - elapsed
        if self.deadline_s is not None:
            left = min(left, self.deadline_s - elapsed)
        return left

    def persist(self) -> None:
        """Hand the checkpoint, with ``spent`` brought up to date, to ``save_checkpoint``."""
        if self.save is None:
            return
        self.checkpoint[SPENT_KEY] = {
            "model_calls": max(self.prior_calls, self.calls),
            "elapsed_ms": round((self.prior_elapsed + self.elapsed()) * 1000),
        }
        self.save(self.checkpoint)

    def poll(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise ResearchCanceled("the research run was canceled")

    def stage(self, name: str, status: str, count: int, started: float, filtered: int = 0):
        self.stages.append(
            {
                "name": name,
                "status": status,
                "candidate_count": count,
                "filtered_count": filtered,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            }
        )

    def call(self, step: str, selection, prompt: reasoning.Prompt) -> dict | None:
        """Run one model step (or reuse its checkpointed outcome); ``None`` when it failed or
        the budget does not allow it (recorded)."""
        saved = self.checkpoint.get(step)
        if isinstance(saved, dict) and saved.get("status") in ("ok", "failed"):
            self.calls += 1
            self.calls_reused += 1
            if saved["status"] == "ok":
                try:  # checked again: a stored checkpoint is data like any other
                    return prompt.schema.parse(json.dumps(saved.get("output")))
                except reasoning.ReasoningInvalidOutput:
                    saved = {"status": "failed", "error": reasoning.ReasoningInvalidOutput.code}
            self._degrade(str(saved.get("error") or "reasoning_error")[:64])
            return None
        if self.calls >= self.max_calls:
            self.budget_exhausted = self.budget_exhausted or "model_calls"
            return None
        left = self.remaining()
        if left < MIN_CALL_SECONDS:
            self.budget_exhausted = self.budget_exhausted or "wall_clock"
            return None
        self.calls += 1
        self.persist()  # the call counts once started: a cancel mid-call does not refund it
        try:
            answer = reasoning.ask(
                self.space,
                selection,
                prompt,
                timeout_ms=int(left * 1000),
                should_stop=self.should_stop,
            )
            outcome = {"status": "ok", "output": answer.output}
        except reasoning.ReasoningCanceled:
            raise ResearchCanceled("the research run was canceled during a model call") from None
        except reasoning.ReasoningError as exc:
            outcome = {"status": "failed", "error": exc.code}
            if self.remaining() < MIN_CALL_SECONDS:
                self.budget_exhausted = self.budget_exhausted or "wall_clock"
        self.checkpoint[step] = outcome
        self.persist()
        if outcome["status"] == "failed":
            self._degrade(outcome["error"])
            return None
        return outcome["output"]

    def _degrade(self, reason: str) -> None:
        if not self.degraded:
            self.degraded = True
            self.degradation_reason = reason


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
):
    """Return a :class:`retrieval.services.RetrievalResult` with ``mode="research"``.

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
    ``retrieve`` (400/409/503); model failures never raise, they degrade. Raises
    :class:`ResearchCanceled` when ``should_stop()`` answers ``True`` (between steps, or within
    about a second during a model call, whose connection is shut down).
    """
    from spaces.readiness import require_ready

    from . import filters as filtering
    from .services import validate_request

    query, top_k, score_threshold, _ = validate_request(query, top_k, score_threshold, "research")
    filters = filtering.parse(filters)  # 400 before any model call
    total = time.perf_counter()
    policy = DURABLE if durable else INTERACTIVE
    max_calls = policy.max_model_calls
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
    selection = reasoning.reasoning_selection(run.profile)
    plan = _plan(run, selection, query)
    run.poll()
    return _Retrieval(run, selection, query, top_k, score_threshold, filters, plan, total).run()


@dataclass
class _Plan:
    path: str
    intent: str | None
    sub_queries: list[str]
    dimensions: list[str]


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


def _planner_prompt(query: str) -> reasoning.Prompt:
    system = reasoning.system_prompt(
        "You plan searches over a knowledge base for the question below. Name its intent, "
        "list up to 3 sub-queries only when the question has distinct parts (an empty list "
        "when it is simple), and list the evidence dimensions a complete answer needs.",
        reasoning.PLAN,
    )
    return reasoning.Prompt(system, f"Question:\n{query}", reasoning.PLAN)


class _Retrieval:
    """Recall, fusion, pool, rerank, threshold, judge and supplemental round of one run."""

    def __init__(self, run, selection, query, top_k, threshold, filters, plan, started):
        from .planner import plan as make_plan

        self.run_ = run
        self.selection = selection
        self.query = query
        self.top_k = top_k
        self.threshold = threshold
        self.filters = filters
        self.plan = plan
        self.started = started
        # retrieval-planner-v1's Research figures: legs read min(max(top_k × 10, 50), 100);
        # fusion_limit min(top_k × 5, 100) bounds the supplemental list.
        self.figures = make_plan("research", top_k, query)
        self.depth = self.figures.dense_top_k
        self.supplement_limit = self.figures.fusion_limit
        self.cap = min(settings.KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES, MAX_POOL)
        self.queries = [_Query(query, "original", ORIGINAL_WEIGHT)] + [
            _Query(q, "planned", PLANNED_WEIGHT) for q in plan.sub_queries
        ]
        self.rounds = 1
        self.coverage = None
        self.reranked: dict[uuid.UUID, float] = {}
        self.rerank_calls = 0
        self.nodes: dict = {}

    def run(self):
        from . import filters as filtering
        from .services import _rerank_selection, resolve_snapshot

        run = self.run_
        self.snapshot = resolve_snapshot(run.space)
        self.rerank = _rerank_selection(run.profile)
        self.allowed = filtering.resolve(run.space, self.filters)
        allowed = self.allowed
        t0 = time.perf_counter()
        if allowed is not None:
            run.stages.append(
                {"name": "filter", "status": "executed", "candidate_count": allowed.considered,
                 "filtered_count": allowed.filtered, "duration_ms": allowed.duration_ms}
            )  # fmt: skip
        else:
            run.stage("filter", "skipped", 0, t0)
        self._recall(self.queries)
        run.poll()
        t0 = time.perf_counter()
        pool, counts = shared_pool([q.ranked for q in self.queries], self.cap)
        self.pool = pool
        self.counts = counts
        candidates = len({n for q in self.queries for n, _, _ in q.ranked})
        run.stage("fusion", "executed" if candidates else "skipped", candidates, t0,
                  filtered=candidates - len(pool))  # fmt: skip
        self._rerank_new(pool)
        run.poll()
        final, filtered = self._rank()
        self._record_round(final, filtered)
        if run.policy.judge and self.plan.path == "reasoning" and self.plan.dimensions:
            final, filtered = self._judge_and_supplement(final, filtered)
        else:
            t0 = time.perf_counter()
            run.stage("judge", "skipped", 0, t0)
            run.stage("supplemental", "skipped", 0, t0)
        return self._result(final, filtered)

    # -- recall ----------------------------------------------------------------------------------

    def _recall(self, queries: list[_Query], *, record: bool = True) -> None:
        """Embed ``queries`` in one batch, run both legs for each at Research depth within the
        resolved filter, and fuse each query's legs (Fast's min-max fusion). ``record`` adds the
        ``embed``, ``dense`` and ``keyword`` stages (counts and times summed over queries)."""
        from .services import LEGS, embed_queries, fuse, recall

        run = self.run_
        nothing_allowed = self.allowed is not None and not self.allowed.document_ids
        vectors = None
        t0 = time.perf_counter()
        if self.snapshot.version is not None and not nothing_allowed:
            vectors = embed_queries(run.space, self.snapshot, [q.text for q in queries])
            self._add_timing("embed_ms", t0)
        if record:
            run.stage("embed", "executed" if vectors is not None else "skipped",
                      len(queries) if vectors is not None else 0, t0)  # fmt: skip
        ran: dict[str, float] = {}
        for index, q in enumerate(queries):
            legs, timings = recall(
                run.space,
                self.snapshot,
                q.text,
                depth=self.depth,
                legs=LEGS,
                filters=self.allowed,
                vector=vectors[index] if vectors is not None else None,
            )
            for name, ms in timings.items():
                run.timings[name] = run.timings.get(name, 0.0) + ms
                ran[name] = ran.get(name, 0.0) + ms
            q.dense = len(legs.get("dense", []))
            q.keyword = len(legs.get("keyword", []))
            q.ranked = fuse(legs) if legs else []
        if record:
            for leg in LEGS:
                count = sum(q.dense if leg == "dense" else q.keyword for q in queries)
                ms = ran.get(f"{leg}_ms")
                run.stages.append(
                    {"name": leg, "status": "executed" if ms is not None else "skipped",
                     "candidate_count": count, "filtered_count": 0,
                     "duration_ms": round(ms or 0.0, 2)}
                )  # fmt: skip

    def _add_timing(self, name: str, t0: float) -> None:
        timings = self.run_.timings
        timings[name] = timings.get(name, 0.0) + (time.perf_counter() - t0) * 1000

    # -- ranking ---------------------------------------------------------------------------------

    def _rerank_new(self, ids: list[uuid.UUID], *, record: bool = True) -> None:
        """Rerank the candidates of ``ids`` not reranked yet, in one call (none without a
        reranker); their scores join :attr:`reranked`. ``record`` adds the ``rerank`` stage."""
        from .services import _nodes, _rerank

        t0 = time.perf_counter()
        new = [i for i in ids if i not in self.reranked]
        if self.rerank is None or not new:
            if record:
                self.run_.stage("rerank", "skipped", 0, t0)
            return
        self.nodes.update(_nodes([i for i in new if i not in self.nodes]))
        pool = [(i, 0.0, {}) for i in new if i in self.nodes]
        ranked = _rerank(self.run_.space, self.rerank, self.query, pool, self.nodes)
        for node_id, score, _ in ranked:
            self.reranked[node_id] = score
        self.rerank_calls += 1
        if record:
            self.run_.stage("rerank", "executed", len(pool), t0)
        self._add_timing("rerank_ms", t0)

    def _rank(self) -> tuple[Ranked, int]:
        """Order the pool: the reranker's score (the combined order breaking ties), else the
        weighted-max score; apply the threshold and ``top_k``. Returns ``(final, removed by
        threshold)``."""
        t0 = time.perf_counter()
        fused = weighted_max([q.ranked for q in self.queries], [q.weight for q in self.queries])
        self.fused_count = len(fused)
        in_pool = set(self.pool)
        ranked = [r for r in fused if r[0] in in_pool]
        if self.rerank is not None:
            ranked = [
                (node_id, self.reranked[node_id], {**per_leg, "rerank": self.reranked[node_id]})
                for node_id, _, per_leg in ranked
                if node_id in self.reranked
            ]
            ranked.sort(key=lambda r: -r[1])  # stable: the combined order breaks ties
        before = len(ranked)
        if self.threshold is not None:
            ranked = [r for r in ranked if r[1] >= self.threshold]
        # One threshold stage, the latest ranking's (a supplemental round ranks again).
        stages = self.run_.stages
        earlier = next((i for i, s in enumerate(stages) if s["name"] == "threshold"), None)
        status = "executed" if self.threshold is not None else "skipped"
        self.run_.stage("threshold", status, before, t0, filtered=before - len(ranked))
        if earlier is not None:
            stages[earlier] = stages.pop()
        return ranked[: self.top_k], before - len(ranked)

    # -- judge and supplemental round ------------------------------------------------------------

    def _judge_and_supplement(self, final: Ranked, filtered: int) -> tuple[Ranked, int]:
        from .services import _nodes

        run = self.run_
        run.poll()
        t0 = time.perf_counter()
        top = final[:JUDGE_MAX_ITEMS]
        missing = [n for n, _, _ in top if n not in self.nodes]
        self.nodes.update(_nodes(missing))
        texts = [self.nodes[n].text[:JUDGE_MAX_ITEM_CHARS] for n, _, _ in top if n in self.nodes]
        output = run.call("judge", self.selection, _judge_prompt(self.query, self.plan, texts))
        failed = run.checkpoint.get("judge", {}).get("status") == "failed"
        if output is not None:
            output = _checked_judgement(output, self.plan.dimensions)
            failed = output is None
            if failed:
                run._degrade(reasoning.ReasoningInvalidOutput.code)
        status = "executed" if output is not None else "degraded" if failed else "skipped"
        run.stage("judge", status, len(texts), t0)
        if output is None:
            run.stage("supplemental", "skipped", 0, time.perf_counter())
            return final, filtered
        self.coverage = {
            "covered": output["covered_dimensions"],
            "missing": output["missing_dimensions"],
        }
        if not (output["needs_supplemental"] and output["missing_dimensions"]):
            run.stage("supplemental", "skipped", 0, time.perf_counter())
            return final, filtered
        run.poll()
        t0 = time.perf_counter()
        prompt = _supplemental_prompt(self.query, output["missing_dimensions"])
        planned = run.call("supplemental", self.selection, prompt)
        known = {q.text.casefold() for q in self.queries}
        if planned is None or planned["query"].casefold() in known:
            run.stage("supplemental", "skipped", 0, t0)
            return final, filtered
        extra = _Query(planned["query"], "supplemental", PLANNED_WEIGHT)
        self._recall([extra], record=False)
        self.queries.append(extra)
        taken = set(self.pool)
        added = [n for n, _, _ in extra.ranked if n not in taken][: self.supplement_limit]
        self.pool.extend(added)
        self.counts.append(len(added))
        self.rounds = 2
        self._rerank_new(added, record=False)
        run.stage("supplemental", "executed", len(added), t0)
        run.poll()
        final, filtered = self._rank()
        self._record_round(final, filtered)
        return final, filtered

    def _record_round(self, final: Ranked, filtered: int) -> None:
        """Durable runs: write this round's evidence (its ranked, hydrated items and a few
        counts) into the checkpoint at ``rounds[round - 1]`` and save it, so a task can show
        it as partial evidence before the run ends. A resumed run redoing a round rewrites it."""
        from .services import RetrievalResult, _nodes

        run = self.run_
        if run.save is None:
            return
        missing = [n for n, _, _ in final if n not in self.nodes]
        self.nodes.update(_nodes(missing))
        items = self._items(final)
        body = RetrievalResult(mode="research", items=items).as_dict()
        evidence = {
            "items": body["items"],
            "metrics": {
                "research_round": self.rounds,
                "queries": [q.text for q in self.queries],
                "rerank_pool": len(self.pool),
                "threshold_filtered_candidates": filtered,
                "research_model_calls": run.calls,
                "elapsed_ms": round(run.elapsed() * 1000),
            },
        }
        rounds = run.checkpoint.get(ROUNDS_KEY)
        rounds = list(rounds) if isinstance(rounds, list) else []
        run.checkpoint[ROUNDS_KEY] = rounds[: self.rounds - 1] + [evidence] + rounds[self.rounds :]
        run.persist()

    def _items(self, final: Ranked):
        from .services import _hydrate

        nodes = {n: self.nodes[n] for n, _, _ in final if n in self.nodes}
        return _hydrate(final, nodes if len(nodes) == len(final) else None)

    # -- result ----------------------------------------------------------------------------------

    def _result(self, final: Ranked, filtered: int):
        from .services import RetrievalResult

        run = self.run_
        items = self._items(final)
        snapshot = self.snapshot
        metrics = {
            "research_path": self.plan.path,
            "research_policy": run.policy.name,
            "research_model_calls": run.calls,
            "research_model_calls_reused": run.calls_reused,
            "research_model_calls_abandoned": run.calls_abandoned,
            "research_elapsed_ms": round((run.prior_elapsed + run.elapsed()) * 1000),
            "research_rounds": self.rounds,
            "research_supplemental_searches": sum(
                1 for q in self.queries if q.role == "supplemental"
            ),
            "budget_exhausted": run.budget_exhausted,
            "degraded": run.degraded,
            "degradation_reason": run.degradation_reason,
            "research_coverage": self.coverage,
            "rerank_pool": len(self.pool),
            "research_lists": [
                {
                    "role": q.role,
                    "weight": q.weight,
                    "candidates": len(q.ranked),
                    "pool": self.counts[i] if i < len(self.counts) else 0,
                }
                for i, q in enumerate(self.queries)
            ],
            "dense_candidates": sum(q.dense for q in self.queries),
            "keyword_candidates": sum(q.keyword for q in self.queries),
            "fused_candidates": self.fused_count,
            "threshold_filtered_candidates": filtered,
            **(
                {"rerank_candidates": len(self.reranked), "rerank_calls": self.rerank_calls}
                if self.rerank is not None
                else {}
            ),
            **(
                {
                    "filter_allowed_documents": len(self.allowed.document_ids),
                    "metadata_filtered_documents": self.allowed.filtered,
                }
                if self.allowed is not None
                else {}
            ),
            "publication_revision": snapshot.head_revision,
            "index_version": snapshot.version[0] if snapshot.version is not None else None,
            **{k: round(v, 2) for k, v in run.timings.items()},
            "total_ms": round((time.perf_counter() - self.started) * 1000, 2),
        }
        plan = {
            **self.figures.as_dict(),
            "version": PLANNER_VERSION,
            "rerank_limit": self.cap,
            "supplemental_limit": self.supplement_limit,
            "combination": COMBINATION,
            "research_path": self.plan.path,
            "prompt_version": reasoning.PROMPT_VERSION if self.plan.path == "reasoning" else None,
            "intent": self.plan.intent,
            "evidence_dimensions": self.plan.dimensions,
            "queries": [{"text": q.text, "role": q.role, "weight": q.weight} for q in self.queries],
        }
        return RetrievalResult(
            mode="research", items=items, metrics=metrics, plan=plan, stages=run.stages
        )


def _judge_prompt(query: str, plan: _Plan, texts: list[str]) -> reasoning.Prompt:
    block = reasoning.untrusted_block(texts)
    system = reasoning.system_prompt(
        "You judge whether retrieved evidence covers a question. For each evidence dimension "
        "listed (copy the labels exactly; use no other label), say whether the evidence "
        "supports it, and whether one more search would likely find what is missing.",
        reasoning.JUDGE,
    )
    labels = "\n".join(f"- {d}" for d in plan.dimensions)
    user = f"Question:\n{query}\n\nEvidence dimensions:\n{labels}\n\nEvidence:\n{block.text}"
    return reasoning.Prompt(system, user, reasoning.JUDGE)


def _checked_judgement(output: dict, dimensions: list[str]) -> dict | None:
    """The judge may only name the planner's own dimension labels (case ignored); anything
    else is invalid output. Returns the judgement with the planner's spelling."""
    known = {d.casefold(): d for d in dimensions}
    checked = {}
    for key in ("covered_dimensions", "missing_dimensions"):
        labels = [known.get(d.casefold()) for d in output[key]]
        if None in labels:
            return None
        checked[key] = labels
    return {**checked, "needs_supplemental": output["needs_supplemental"]}


def _supplemental_prompt(query: str, missing: list[str]) -> reasoning.Prompt:
    system = reasoning.system_prompt(
        "You write one search query over a knowledge base that would find the facts a "
        "question still lacks. Use the question and the missing fact labels only.",
        reasoning.SUPPLEMENT,
    )
    labels = "\n".join(f"- {d}" for d in missing)
    return reasoning.Prompt(
        system, f"Question:\n{query}\n\nMissing facts:\n{labels}", reasoning.SUPPLEMENT
    )
