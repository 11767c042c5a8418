"""One Research run's retrieval rounds (:class:`_Retrieval`): recall per query, the shared
pool, one rerank, the threshold, the judge and the supplemental round, and the result."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from django.conf import settings

from .. import reasoning
from .budget import ROUNDS_KEY
from .pooling import Ranked, shared_pool, weighted_max
from .prompts import _checked_judgement, _judge_prompt, _supplemental_prompt

PLANNER_VERSION = "retrieval-planner-v2"  # v1's figures plus Research's queries (inventory §5.2)
COMBINATION = "weighted-max"
ORIGINAL_WEIGHT = 1.0
PLANNED_WEIGHT = 0.9  # ours: bench/scifact_pairs.py, docs/benchmarks.md (0.9 vs 1.0 and 0.5)
MAX_POOL = 200  # seed deployment guide: KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES is capped at 200
JUDGE_MAX_ITEMS = 10
JUDGE_MAX_ITEM_CHARS = 2000


@dataclass
class _Query:
    text: str
    role: str  # original | planned | supplemental
    weight: float
    ranked: Ranked = field(default_factory=list)
    dense: int = 0
    keyword: int = 0


class _Retrieval:
    """Recall, fusion, pool, rerank, threshold, judge and supplemental round of one run."""

    def __init__(self, run, selection, query, top_k, threshold, filters, plan, started):
        from ..planner import plan as make_plan

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
        from .. import filters as filtering
        from ..recall import rerank_selection, resolve_snapshot
        from ..reranking import local_rerank_applies

        run = self.run_
        self.snapshot = resolve_snapshot(run.space)
        self.rerank = rerank_selection(run.profile)
        self.local = local_rerank_applies(run.profile, "research")
        if self.local:
            self.rerank = None  # the local cross-encoder replaces the profile's (local runtime)
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
        resolved filter, and fuse each query's legs (Fast's fusion, :mod:`retrieval.calibration`).
        ``record`` adds the ``embed``, ``dense`` and ``keyword`` stages (counts and times summed
        over queries)."""
        from ..calibration import DEFAULT_FUSION, fuse_legs
        from ..recall import LEGS, embed_queries, recall

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
            q.ranked = fuse_legs(DEFAULT_FUSION, legs, q.text, self.snapshot, self.depth)
        if record:
            for leg in LEGS:
                count = sum(q.dense if leg == "dense" else q.keyword for q in queries)
                leg_ms = ran.get(f"{leg}_ms")
                run.stages.append(
                    {"name": leg, "status": "executed" if leg_ms is not None else "skipped",
                     "candidate_count": count, "filtered_count": 0,
                     "duration_ms": round(leg_ms or 0.0, 2)}
                )  # fmt: skip

    def _add_timing(self, name: str, t0: float) -> None:
        timings = self.run_.timings
        timings[name] = timings.get(name, 0.0) + (time.perf_counter() - t0) * 1000

    # -- ranking ---------------------------------------------------------------------------------

    def _rerank_new(self, ids: list[uuid.UUID], *, record: bool = True) -> None:
        """Rerank the candidates of ``ids`` not reranked yet, in one call (none without a
        reranker); their scores join :attr:`reranked`. ``record`` adds the ``rerank`` stage."""
        from ..recall import load_nodes, rerank

        t0 = time.perf_counter()
        new = [i for i in ids if i not in self.reranked]
        if self.local and new:
            self._rerank_locally(new, record=record)
            self._add_timing("rerank_ms", t0)
            return
        if self.rerank is None or not new:
            if record:
                self.run_.stage("rerank", "skipped", 0, t0)
            return
        self.nodes.update(load_nodes([i for i in new if i not in self.nodes]))
        pool: Ranked = [(i, 0.0, {}) for i in new if i in self.nodes]
        ranked = rerank(self.run_.space, self.rerank, self.query, pool, self.nodes)
        for node_id, score, _ in ranked:
            self.reranked[node_id] = score
        self.rerank_calls += 1
        if record:
            self.run_.stage("rerank", "executed", len(pool), t0)
        self._add_timing("rerank_ms", t0)

    def _rerank_locally(self, new: list[uuid.UUID], *, record: bool) -> None:
        """The local cross-encoder over ``new`` in the combined first-stage order, its mixed
        score (:mod:`retrieval.reranking`) joining :attr:`reranked` for every one of them."""
        from ..calibration import DEFAULT_FUSION, effective_fusion
        from ..recall import load_nodes, stage
        from ..reranking import rerank_locally

        self.nodes.update(load_nodes([i for i in new if i not in self.nodes]))
        fused = weighted_max([q.ranked for q in self.queries], [q.weight for q in self.queries])
        wanted = set(new)
        first = [r for r in fused if r[0] in wanted and r[0] in self.nodes]
        texts = {node_id: self.nodes[node_id].text for node_id, _, _ in first}
        fusion = effective_fusion(DEFAULT_FUSION, self.snapshot)
        ranked, info = rerank_locally(self.query, first, texts, fusion=fusion)
        for node_id, score, _ in ranked:
            self.reranked[node_id] = score
        self.rerank_calls += 1
        if record:
            entry = stage("rerank", True, info["candidates"], 0, info["duration_ms"])
            if info["degraded"]:
                entry["degraded"] = info["degraded"]
            self.run_.stages.append(entry)

    def _rank(self) -> tuple[Ranked, int]:
        """Order the pool: the reranker's score (the combined order breaking ties), else the
        weighted-max score; apply the threshold and ``top_k``. Returns ``(final, removed by
        threshold)``."""
        t0 = time.perf_counter()
        fused = weighted_max([q.ranked for q in self.queries], [q.weight for q in self.queries])
        self.fused_count = len(fused)
        in_pool = set(self.pool)
        ranked = [r for r in fused if r[0] in in_pool]
        if self.rerank is not None or self.local:
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
        from ..recall import load_nodes

        run = self.run_
        run.poll()
        t0 = time.perf_counter()
        top = final[:JUDGE_MAX_ITEMS]
        missing = [n for n, _, _ in top if n not in self.nodes]
        self.nodes.update(load_nodes(missing))
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
        from ..recall import RetrievalResult, load_nodes

        run = self.run_
        if run.save is None:
            return
        missing = [n for n, _, _ in final if n not in self.nodes]
        self.nodes.update(load_nodes(missing))
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
        from ..recall import hydrate

        nodes = {n: self.nodes[n] for n, _, _ in final if n in self.nodes}
        return hydrate(final, nodes if len(nodes) == len(final) else None)

    # -- result ----------------------------------------------------------------------------------

    def _result(self, final: Ranked, filtered: int):
        from ..recall import RetrievalResult

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
                if self.rerank is not None or self.local
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
