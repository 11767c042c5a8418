"""The dry-run estimate of a research task and the check of its limits against it.

:func:`estimate` reads the space's retrieval profile (the reasoning model decides the path),
its nodes (mean length, for the evidence budget) and its completed tasks (measured durations);
it creates nothing. Figures and their sources:

* **model calls**: the reasoning path makes the planner call and the evidence judge, plus at
  most one more for the supplemental round: ``min`` 2, ``max`` 3 (issue: durable Research "≤ 3
  model calls plus at most one supplemental round"); the deterministic path (no reasoning
  model, the embedded default) makes none.
* **tokens**: input per call = :data:`PROMPT_OVERHEAD_TOKENS` + the query's tokens, plus for each
  judge call the evidence budget (``min(top_k, DURABLE_MAX_ITEMS)`` items × the space's mean node
  length in tokens); output ≤ ``KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS`` (8192) per call.
  Token counts use the packing approximation of the reference inventory §5.7 (a Latin run of
  ≤ 8 characters is 1 token, longer runs ``ceil(n / 4)``, every other non-space character 1).
* **latency**: ``measured`` when tasks of this space have completed (nearest-rank p50/p95 of
  their run time, at most the last :data:`LATENCY_SAMPLES`), else ``configured``: the per-call
  ``KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS`` (60000) × min and max model calls, capped at the
  task's ``timeout_ms`` (upper bounds, not observations); unknown (``null``) for the
  deterministic path before any task completed.

:func:`violations` lists the limits the estimate cannot meet: ``max_model_calls`` below the
maximum calls, ``timeout_ms`` below the p50 latency.
"""

from __future__ import annotations

import math
import re

from django.conf import settings
from django.db.models import Avg
from django.db.models.functions import Length

from knowledgefs.errors import InvalidInput

from .models import ResearchTask, RunState

MAX_TOP_K = 50
"""``top_k`` of a research task: 1..50 (reference inventory §3.4, ``topK`` 1–50)."""
DURABLE_MAX_MODEL_CALLS = 3
"""Durable Research makes at most 3 model calls (issue; reference inventory §5.3)."""
DURABLE_MAX_ITEMS = 40
DURABLE_ROUNDS = 2
DURABLE_SUPPLEMENTAL_QUERIES = 1
MAX_PLANNED_QUERIES = 4
"""The original query and at most 3 planned sub-queries (issue: "at most 3 sub-queries")."""
RECALL_MULTIPLIER = 10
PROMPT_OVERHEAD_TOKENS = 600
"""Our estimate of a planner or judge prompt's fixed part (instructions and output schema)."""
LATENCY_SAMPLES = 100
DEFAULT_RERANK_POOL = 200
LIMIT_KEYS = ("max_model_calls", "timeout_ms")
MIN_TIMEOUT_MS = 1000

_LATIN_RUN = re.compile(r"[0-9A-Za-z\u00c0-\u024f]+")


def approx_tokens(text: str) -> int:
    """Tokens of ``text`` by the reference inventory §5.7 approximation (see the module)."""
    tokens = 0
    for run in _LATIN_RUN.findall(text):
        tokens += 1 if len(run) <= 8 else math.ceil(len(run) / 4)
    rest = _LATIN_RUN.sub("", text)
    return tokens + sum(1 for ch in rest if not ch.isspace())


def validate_limits(raw) -> dict:
    """``limits`` of a request → ``{"max_model_calls", "timeout_ms"}`` with defaults filled.

    ``max_model_calls`` is an integer 0..3 (default 3), ``timeout_ms`` an integer
    1000..180000 (default ``KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS``). Raises 400
    ``invalid_limits`` naming the member and its range.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput("limits must be an object", code="invalid_limits")
    unknown = sorted(set(raw) - set(LIMIT_KEYS))
    if unknown:
        raise InvalidInput(
            f"limits has unknown members {unknown}; accepted: {', '.join(LIMIT_KEYS)}",
            code="invalid_limits",
        )
    ranges = {
        "max_model_calls": (0, DURABLE_MAX_MODEL_CALLS, DURABLE_MAX_MODEL_CALLS),
        "timeout_ms": (
            MIN_TIMEOUT_MS,
            settings.KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS,
            settings.KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS,
        ),
    }
    limits = {}
    for name, (low, high, default) in ranges.items():
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidInput(
                f"limits.{name} must be an integer from {low} to {high}", code="invalid_limits"
            )
        limits[name] = value
    return limits


def validate_top_k(top_k) -> int:
    """``top_k`` 1..50 (default 10); 400 ``invalid_top_k``."""
    if top_k is None:
        return 10
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(f"top_k must be an integer from 1 to {MAX_TOP_K}", code="invalid_top_k")
    return top_k


def estimate(space, query: str, *, top_k: int, limits: dict) -> dict:
    """The plan of a research task over ``space`` (see the module for every figure).

    Returns ``{"path", "model_calls": {min, max}, "tokens": {"input": {min, max}, "output":
    {min, max}, "basis"}, "latency_ms": {"p50", "p95", "basis", "samples"}, "steps": [{name,
    model_call, description}], "work_bounds": {...}, "limits", "violations"}``.
    """
    from spaces.profiles import profile_of

    profile = profile_of(space)
    reasoning = bool(profile.retrieval_reasoning_model)
    rerank = bool(profile.retrieval_rerank_enabled)
    calls = (2, DURABLE_MAX_MODEL_CALLS) if reasoning else (0, 0)
    tokens = _tokens(space, query, top_k, calls)
    latency = _latency(space, calls, limits["timeout_ms"])
    plan = {
        "path": "reasoning" if reasoning else "deterministic",
        "model_calls": {"min": calls[0], "max": calls[1]},
        "tokens": tokens,
        "latency_ms": latency,
        "steps": _steps(reasoning, rerank),
        "work_bounds": _work_bounds(top_k, reasoning, rerank, limits),
        "limits": limits,
    }
    plan["violations"] = violations(plan, limits)
    return plan


def violations(plan: dict, limits: dict) -> list[dict]:
    """The limits ``plan`` cannot meet: ``[{limit, limit_value, estimated_value}]``."""
    found = []
    needed = plan["model_calls"]["max"]
    if limits["max_model_calls"] < needed:
        found.append(
            {
                "limit": "max_model_calls",
                "limit_value": limits["max_model_calls"],
                "estimated_value": needed,
            }
        )
    p50 = plan["latency_ms"]["p50"]
    if p50 is not None and limits["timeout_ms"] < p50:
        found.append(
            {"limit": "timeout_ms", "limit_value": limits["timeout_ms"], "estimated_value": p50}
        )
    return found


def _mean_node_chars(space) -> int:
    from ingestion.models import KnowledgeNode

    mean = (
        KnowledgeNode.objects.filter(space_id=space.id)
        .aggregate(mean=Avg(Length("text")))
        .get("mean")
    )
    return round(mean) if mean else settings.KNOWLEDGE_CHUNK_TARGET_CHARS


def _tokens(space, query: str, top_k: int, calls: tuple[int, int]) -> dict:
    if calls[1] == 0:
        zero = {"min": 0, "max": 0}
        return {"input": zero, "output": dict(zero), "basis": "no model calls"}
    query_tokens = approx_tokens(query)
    node_chars = _mean_node_chars(space)
    evidence = min(top_k, DURABLE_MAX_ITEMS) * math.ceil(node_chars / 4)
    per_call = [PROMPT_OVERHEAD_TOKENS + query_tokens]  # the planner
    per_call += [PROMPT_OVERHEAD_TOKENS + query_tokens + evidence] * (calls[1] - 1)  # judges
    output = settings.KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS
    return {
        "input": {"min": sum(per_call[: calls[0]]), "max": sum(per_call)},
        "output": {"min": 0, "max": calls[1] * output},
        "basis": (
            f"query {query_tokens} tokens; evidence budget {min(top_k, DURABLE_MAX_ITEMS)} items "
            f"× {math.ceil(node_chars / 4)} tokens (mean node {node_chars} characters); "
            f"output ≤ {output} tokens per call"
        ),
    }


def _nearest_rank(values: list[int], percent: int) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def _latency(space, calls: tuple[int, int], timeout_ms: int) -> dict:
    measured = list(
        ResearchTask.objects.filter(
            space_id=space.id, run_state=RunState.COMPLETED, elapsed_ms__gt=0
        )
        .order_by("-finished_at")
        .values_list("elapsed_ms", flat=True)[:LATENCY_SAMPLES]
    )
    if measured:
        return {
            "p50": _nearest_rank(measured, 50),
            "p95": _nearest_rank(measured, 95),
            "basis": "measured",
            "samples": len(measured),
        }
    if calls[1] == 0:
        return {"p50": None, "p95": None, "basis": "unknown", "samples": 0}
    per_call = settings.KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS
    return {
        "p50": min(calls[0] * per_call, timeout_ms),
        "p95": min(calls[1] * per_call, timeout_ms),
        "basis": "configured",
        "samples": 0,
    }


def _steps(reasoning: bool, rerank: bool) -> list[dict]:
    def step(name, description, model_call=False):
        return {"name": name, "model_call": model_call, "description": description}

    steps = []
    if reasoning:
        steps.append(step("plan", "the reasoning model plans intent and sub-queries", True))
    else:
        steps.append(step("decompose", "local query decomposition (no model call)"))
    steps += [
        step("embed", "one batched embedding of all planned queries"),
        step("recall", "dense and keyword recall per query"),
        step("fuse", "weighted reciprocal rank fusion"),
    ]
    if rerank:
        steps.append(step("rerank", "one rerank of the shared candidate pool"))
    if reasoning:
        steps.append(step("judge", "the reasoning model judges the evidence set", True))
        steps.append(
            step("supplement", "at most one supplemental query, recall and judgement", True)
        )
    steps.append(step("assemble", "evidence with citations"))
    return steps


def _work_bounds(top_k: int, reasoning: bool, rerank: bool, limits: dict) -> dict:
    pool = getattr(settings, "KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES", DEFAULT_RERANK_POOL)
    rounds = DURABLE_ROUNDS if reasoning else 1
    return {
        "rounds": rounds,
        "supplemental_queries": DURABLE_SUPPLEMENTAL_QUERIES if reasoning else 0,
        "planned_queries": MAX_PLANNED_QUERIES,
        "recall_per_query_and_leg": min(top_k * RECALL_MULTIPLIER, settings.RETRIEVAL_MAX_TOP_K),
        "rerank_candidates": pool if rerank else 0,
        "rerank_calls": rounds if rerank else 0,
        "max_items": top_k,
        "timeout_ms": limits["timeout_ms"],
    }
