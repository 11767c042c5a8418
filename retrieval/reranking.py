"""The local reranker in retrieval: which requests use it, and how its score joins the first stage.

Under ``KNOWLEDGE_MODEL_RUNTIME=local`` (no Dify reranker) the cross-encoder of
:mod:`knowledgefs.runtime.local_rerank` reranks Deep's pool and Research's shared pool always,
and Fast's candidates when the space's retrieval profile enables rerank
(``KNOWLEDGE_LOCAL_RERANK_ENABLED=0`` turns it off). Only the first
``KNOWLEDGE_LOCAL_RERANK_TOP_N`` candidates of the first-stage order are scored; the rest keep
their order below them.

The final score of a reranked candidate is a convex mix of the cross-encoder's probability and
the first-stage score: ``final = w · σ(logit / T) + (1 − w) · first``, with ``(w, T)`` per
first-stage fusion (:data:`MIX`: fitted on SciFact train by ``bench/calibrate_fusion.py``;
docs/benchmarks.md). Over the calibrated fusion (an absolute first stage, the default) the
cross-encoder only breaks near-ties (w 0.05, T 8); over a relative first stage (min-max, RRF) it
weighs more (w 0.2, T 2). The cross-encoder alone is weaker than the first stage on SciFact; mixed,
it adds. A candidate below the top N keeps ``min(first-stage score, lowest reranked score)`` so
it never rises above a reranked one.

The call is bounded by ``KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS`` (the wait for a place in the
reranker's concurrency gate included). On timeout the first-stage order is served and the
``rerank`` stage says ``"degraded": "timeout"``. A model file that fails its sha256 check, or
missing files, is a 503 ``rerank_unavailable`` (never a silent fallback).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.conf import settings

from knowledgefs.errors import Unavailable

#: The cross-encoder's share ``w`` of the final score and the temperature ``T`` of its logit, per
#: first-stage fusion (as it ranked the space: :func:`retrieval.calibration.effective_fusion`).
#: Fitted on SciFact train by a grid of w 0-1, T 1/2/4/8 and N 10-30 over nDCG@10
#: (``bench/calibrate_fusion.py``, bench/results/rerank-mix-300-2026-12-03.json): over the
#: calibrated first stage on 300 train claims, no rerank 0.7635, w 0.05 / T 8 0.7691 (N 10-30
#: level; the best, MRR@10 0.7369), w 0.2 / T 2 0.7595 (below no rerank); over min-max on 241
#: train claims, no rerank 0.7534, w 0.2 / T 2 0.7643 (the best, level with w 0.3).
MIX = {"calibrated": (0.05, 8.0)}
#: ``(w, T)`` of a relative first stage (min-max, RRF, a Dify fusion).
MIX_RELATIVE = (0.2, 2.0)
MIX_WEIGHT, MIX_TEMPERATURE = MIX["calibrated"]

Ranked = list[tuple[uuid.UUID, float, dict]]


def local_rerank_applies(profile, mode: str) -> bool:
    """Does this request rerank with the local cross-encoder? (module docstring)."""
    from knowledgefs.runtime import uses_dify

    if uses_dify() or not settings.KNOWLEDGE_LOCAL_RERANK_ENABLED:
        return False
    if mode in ("deep", "research"):
        return True
    return bool(getattr(profile, "retrieval_rerank_enabled", False))


def mix(
    logit: float, first: float, weight: float = MIX_WEIGHT, temperature: float = MIX_TEMPERATURE
):
    """The final score of a reranked candidate (module docstring), within 0..1."""
    import math

    z = logit / temperature
    p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
    return weight * p + (1.0 - weight) * max(min(first, 1.0), 0.0)


def mix_parameters(fusion: str) -> tuple[float, float]:
    """``(w, T)`` of :func:`mix` over a first stage fused by ``fusion`` (:data:`MIX`)."""
    return MIX.get(fusion, MIX_RELATIVE)


def rerank_locally(
    query: str,
    pool: Ranked,
    texts: dict[uuid.UUID, str],
    *,
    fusion: str = "calibrated",
    top_n: int | None = None,
    timeout_ms: int | None = None,
) -> tuple[Ranked, dict]:
    """Rerank ``pool`` (first-stage ``(node_id, score, per_leg)``, best first, fused by
    ``fusion``) with the local cross-encoder. Returns ``(ranked, info)``: ``info`` has
    ``candidates`` (pairs scored), ``duration_ms`` and ``degraded`` (``None``, or
    ``"timeout"`` with the first-stage order). Raises 503 ``rerank_unavailable`` when the
    model cannot be loaded."""
    from knowledgefs.runtime.local_rerank import (
        RerankModelError,
        RerankTimeout,
        get_local_reranker,
    )

    top_n = settings.KNOWLEDGE_LOCAL_RERANK_TOP_N if top_n is None else top_n
    timeout_ms = settings.KNOWLEDGE_LOCAL_RERANK_TIMEOUT_MS if timeout_ms is None else timeout_ms
    t0 = time.perf_counter()
    head = [r for r in pool if r[0] in texts][:top_n]
    info: dict[str, Any] = {"candidates": len(head), "duration_ms": 0.0, "degraded": None}
    if not head:
        return list(pool), info
    try:
        model = get_local_reranker()
    except RerankModelError as exc:
        raise Unavailable(
            f"the local reranker is not usable: {exc}", code="rerank_unavailable"
        ) from None
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        logits = model.score(query, [texts[r[0]] for r in head], deadline=deadline)
    except RerankTimeout:
        info["degraded"] = "timeout"
        info["duration_ms"] = round((time.perf_counter() - t0) * 1000, 2)
        return list(pool), info
    weight, temperature = mix_parameters(fusion)
    reranked = []
    for (node_id, first, per_leg), logit in zip(head, logits, strict=True):
        final = mix(float(logit), first, weight, temperature)
        probability = mix(float(logit), 0.0, weight=1.0, temperature=1.0)
        extra = {"rerank": probability, "rerank_logit": float(logit), "first_stage": first}
        reranked.append((node_id, final, {**per_leg, **extra}))
    reranked.sort(key=lambda r: (-r[1], r[0]))  # ties by id: UUIDs order as their text does
    floor = reranked[-1][1]
    taken = {r[0] for r in head}
    rest = [(n, min(s, floor), p) for n, s, p in pool if n not in taken]
    info["duration_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    return reranked + rest, info
