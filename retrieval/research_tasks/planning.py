"""The dry-run estimate of a research task and the check of its limits against it.

:func:`estimate` reads the space's retrieval profile (the reasoning model decides the path),
its nodes (mean length, for the evidence budget) and its completed tasks (measured durations);
it creates nothing. Figures and their sources:

* **model calls** (:mod:`retrieval.research`): the reasoning path makes the planner call, then
  (when the plan succeeded with evidence dimensions) the evidence judge, then (when the judge
  asks for it) the supplemental planning call: ``min`` 1, ``max`` the durable policy's 3; the
  deterministic path (no reasoning model, the embedded default) makes none.
* **tokens**: input per call = the fixed system prompt of its schema
  (:func:`retrieval.reasoning.system_prompt`) + :data:`TASK_INSTRUCTION_TOKENS` + the query;
  the judge adds the evidence budget (``min(top_k, JUDGE_MAX_ITEMS)`` items × the space's mean
  node length, each cut at ``JUDGE_MAX_ITEM_CHARS``) and the judge and supplemental calls the
  dimension labels (at most ``MAX_DIMENSIONS`` × 120 characters); output ≤
  ``KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS`` (8192) per call. Token counts use the
  packing approximation of the reference inventory §5.7 (a Latin run of ≤ 8 characters is 1
  token, longer runs ``ceil(n / 4)``, every other non-space character 1); evidence text counts
  ``ceil(characters / 4)``.
* **latency**: ``measured`` when tasks of this space have completed (nearest-rank p50/p95 of
  their run time, at most the last :data:`LATENCY_SAMPLES`), else ``configured``: the per-call
  ``KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS`` (60000) × min and max model calls, capped at the
  durable budget of 180 s (upper bounds, not observations); unknown (``null``) for the
  deterministic path before any task completed.

* **query images**: with a reasoning model that accepts images, the one image-to-text
  expansion (:mod:`retrieval.research.images`) is one more call (min and max), its prompt plus
  :data:`IMAGE_INPUT_TOKENS` per image in and at most 400 tokens out, and
  ``KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS`` more configured latency.

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
from retrieval import reasoning
from retrieval.planner import RECALL_MULTIPLIER
from retrieval.recall import MIN_LEG_CANDIDATES
from retrieval.research import DURABLE, JUDGE_MAX_ITEM_CHARS, JUDGE_MAX_ITEMS, MAX_POOL

from .models import ResearchTask, RunState

MAX_TOP_K = 50
"""``top_k`` of a research task: 1..50 (reference inventory §3.4, ``topK`` 1–50)."""
DURABLE_MAX_MODEL_CALLS = DURABLE.max_model_calls
"""Durable Research makes at most 3 model calls (issue; reference inventory §5.3)."""
DURABLE_ROUNDS = 2
DURABLE_SUPPLEMENTAL_QUERIES = DURABLE.max_supplements
MAX_PLANNED_QUERIES = 1 + reasoning.MAX_SUB_QUERIES
"""The original query and at most 3 planned sub-queries (issue: "at most 3 sub-queries")."""
TASK_INSTRUCTION_TOKENS = 80
"""Our allowance for the one-paragraph task instruction each prompt starts with."""
DIMENSION_LABEL_CHARS = 120
LATENCY_SAMPLES = 100
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


def validate_limits(raw, *, extra_calls: int = 0) -> dict:
    """``limits`` of a request → ``{"max_model_calls", "timeout_ms"}`` with defaults filled.

    ``max_model_calls`` is an integer 0..3 (default 3; ``extra_calls`` more with query images:
    the one image-to-text expansion), ``timeout_ms`` an integer
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
        "max_model_calls": (
            0,
            DURABLE_MAX_MODEL_CALLS + extra_calls,
            DURABLE_MAX_MODEL_CALLS + extra_calls,
        ),
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
    """``top_k`` 1..50; 400 ``invalid_top_k``."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(f"top_k must be an integer from 1 to {MAX_TOP_K}", code="invalid_top_k")
    return top_k


def estimate(space, query: str, *, top_k: int, limits: dict, images: int = 0) -> dict:
    """The plan of a research task over ``space`` (see the module for every figure); ``images``
    query images add the one image-to-text expansion when the reasoning model accepts images
    (:func:`_expansion`).

    Returns ``{"path", "model_calls": {min, max}, "tokens": {"input": {min, max}, "output":
    {min, max}, "basis"}, "latency_ms": {"p50", "p95", "basis", "samples"}, "steps": [{name,
    model_call, description}], "work_bounds": {...}, "limits", "violations"}``.
    """
    from spaces.profiles import profile_of

    profile = profile_of(space)
    with_model = bool(profile.retrieval_reasoning_model)
    rerank = bool(profile.retrieval_rerank_enabled)
    calls = (1, DURABLE_MAX_MODEL_CALLS) if with_model else (0, 0)
    expansion = _expansion(profile, images)
    tokens = _tokens(space, query, top_k, calls)
    latency = _latency(space, calls, expansion is not None)
    steps = _steps(with_model, rerank)
    if images:
        steps.insert(0, _expansion_step(expansion))
    if expansion is not None:
        calls = (calls[0] + 1, calls[1] + 1)
        for key in ("input", "output"):
            tokens[key] = {m: tokens[key][m] + expansion[key] for m in ("min", "max")}
        tokens["basis"] += f"; image expansion {expansion['basis']}"
    plan = {
        "path": "reasoning" if with_model else "deterministic",
        "model_calls": {"min": calls[0], "max": calls[1]},
        "tokens": tokens,
        "latency_ms": latency,
        "steps": steps,
        "work_bounds": _work_bounds(top_k, with_model, rerank, limits),
        "limits": limits,
    }
    if images:
        plan["query_images"] = {"count": images, "expansion": expansion is not None}
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


def _prompt_tokens(schema, *parts: str) -> int:
    fixed = approx_tokens(reasoning.system_prompt("", schema)) + TASK_INSTRUCTION_TOKENS
    return fixed + sum(approx_tokens(p) for p in parts)


def _tokens(space, query: str, top_k: int, calls: tuple[int, int]) -> dict:
    if calls[1] == 0:
        zero = {"min": 0, "max": 0}
        return {"input": zero, "output": dict(zero), "basis": "no model calls"}
    node_chars = min(_mean_node_chars(space), JUDGE_MAX_ITEM_CHARS)
    items = min(top_k, JUDGE_MAX_ITEMS)
    evidence = items * math.ceil(node_chars / 4)
    labels = reasoning.MAX_DIMENSIONS * math.ceil(DIMENSION_LABEL_CHARS / 4)
    per_call = [
        _prompt_tokens(reasoning.PLAN, query),
        _prompt_tokens(reasoning.JUDGE, query) + labels + evidence,
        _prompt_tokens(reasoning.SUPPLEMENT, query) + labels,
    ][: calls[1]]
    output = settings.KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS
    return {
        "input": {"min": sum(per_call[: calls[0]]), "max": sum(per_call)},
        "output": {"min": 0, "max": calls[1] * output},
        "basis": (
            f"query {approx_tokens(query)} tokens; judge evidence {items} items × "
            f"{math.ceil(node_chars / 4)} tokens (mean node {node_chars} characters); "
            f"output ≤ {output} tokens per call"
        ),
    }


#: What one query image costs the expansion call, in input tokens: a low-detail image part as
#: the common vision models count it (85); the prompt is counted by the approximation.
IMAGE_INPUT_TOKENS = 85


def _expansion(profile, images: int) -> dict | None:
    """The one image-to-text expansion's tokens, or ``None`` when it will not run (no images,
    or a reasoning model that does not accept images: the images are then ignored)."""
    from retrieval.query_images import EXPANSION_OUTPUT_TOKENS, EXPANSION_PROMPT
    from spaces.capabilities import profile_modality

    if not images or not profile_modality(profile, "reasoning").image:
        return None
    prompt = approx_tokens(EXPANSION_PROMPT)
    return {
        "input": prompt + images * IMAGE_INPUT_TOKENS,
        "output": EXPANSION_OUTPUT_TOKENS,
        "basis": f"{prompt} prompt tokens + {images} × {IMAGE_INPUT_TOKENS} per image, output "
        f"≤ {EXPANSION_OUTPUT_TOKENS}",
    }


def _expansion_step(expansion: dict | None) -> dict:
    return {
        "name": "image_expansion",
        "model_call": expansion is not None,
        "status": "planned" if expansion is not None else "skipped",
        "description": (
            "one image-to-text expansion of the query images by the reasoning model, "
            "searched with the question"
            if expansion is not None
            else "the reasoning model does not accept images: the images are ignored"
        ),
    }


def _nearest_rank(values: list[int], percent: int) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def _latency(space, calls: tuple[int, int], expansion: bool = False) -> dict:
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
    extra = settings.KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS if expansion else 0
    if calls[1] == 0 and not extra:
        return {"p50": None, "p95": None, "basis": "unknown", "samples": 0}
    per_call = settings.KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS
    budget = round(DURABLE.wall_clock_seconds * 1000)
    return {
        "p50": min(calls[0] * per_call + extra, budget),
        "p95": min(calls[1] * per_call + extra, budget),
        "basis": "configured",
        "samples": 0,
    }


def _steps(with_model: bool, rerank: bool) -> list[dict]:
    """The steps in the order Research reports them as ``stages``."""

    def step(name, description, model_call=False, skipped=False):
        return {
            "name": name,
            "model_call": model_call,
            "status": "skipped" if skipped else "planned",
            "description": description,
        }

    plan = (
        step("plan", "the reasoning model plans intent, sub-queries and evidence dimensions", True)
        if with_model
        else step("plan", "local query decomposition (no model call)")
    )
    return [
        plan,
        step("embed", "one batched embedding of the original and planned queries"),
        step("recall", "dense and keyword recall per query, weighted-max combination"),
        step("rerank", "one rerank of the shared candidate pool", skipped=not rerank),
        step("threshold", "the score threshold, then top_k"),
        step("judge", "the reasoning model judges the evidence set", True, not with_model),
        step(
            "supplemental",
            "at most one supplemental query (one model call), its recall and rerank",
            True,
            not with_model,
        ),
    ]


def _work_bounds(top_k: int, with_model: bool, rerank: bool, limits: dict) -> dict:
    pool = min(settings.KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES, MAX_POOL)
    rounds = DURABLE_ROUNDS if with_model else 1
    return {
        "rounds": rounds,
        "supplemental_queries": DURABLE_SUPPLEMENTAL_QUERIES if with_model else 0,
        "planned_queries": MAX_PLANNED_QUERIES,
        "recall_per_query_and_leg": min(
            max(top_k * RECALL_MULTIPLIER["research"], MIN_LEG_CANDIDATES),
            settings.RETRIEVAL_MAX_TOP_K,
        ),
        "rerank_candidates": pool if rerank else 0,
        "rerank_calls": rounds if rerank else 0,
        "max_items": top_k,
        "timeout_ms": limits["timeout_ms"],
    }
