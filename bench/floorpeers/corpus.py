"""The texts, vectors and queries of one scale-curve size without a database: the same
``(copy, document)`` layout and seeded noisy vectors as ``bench/scale_curve.py generate``
(:func:`scale.state.layout`, :func:`scale.state.copy_vectors`), so the floor and the peers search
exactly the rows the product's spaces hold. Imports numpy and :mod:`scale.state` only (it runs
in the bench venvs, which do not install the project; the parent puts ``bench/`` on
``PYTHONPATH``)."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
from scale.state import copy_vectors, layout, load_source, state_dir

DEPTH = 50  # candidates per leg: Fast's depth at top_k 10 (retrieval.planner)
TOP_K = 10


def build_corpus(size: int) -> dict:
    """``texts`` (list of str), ``vectors`` (float32, ``(chunks, dim)``, unit rows), ``keys``
    (``"<copy>:<source document id>:<chunk index>"`` per row) and ``vectors_sha256`` of the
    matrix bytes (the same bytes the scale curve writes), for ``size`` chunks."""
    t0 = time.perf_counter()
    source = load_source()
    offsets = np.cumsum([0] + [len(d["nodes"]) for d in source["documents"]])
    plan = layout(source, size)
    texts: list[str] = []
    keys: list[str] = []
    blocks: list[np.ndarray] = []
    current, vectors = None, None
    for copy, index in plan:
        if copy != current:
            current, vectors = copy, copy_vectors(source, copy)
        doc = source["documents"][index]
        blocks.append(vectors[offsets[index] : offsets[index + 1]])
        for node in doc["nodes"]:
            texts.append(node["text"])
            keys.append(f"{copy}:{doc['id']}:{node['chunk_index']}")
    matrix = np.ascontiguousarray(np.vstack(blocks), dtype=np.float32)
    return {
        "texts": texts,
        "vectors": matrix,
        "keys": keys,
        "documents": len(plan),
        "copies": plan[-1][0],
        "vectors_sha256": hashlib.sha256(matrix.tobytes()).hexdigest(),
        "corpus_s": round(time.perf_counter() - t0, 2),
    }


def load_queries() -> tuple[list[str], np.ndarray]:
    """The SciFact claims and their precomputed query vectors (``STATE/queries.npz``)."""
    loaded = np.load(state_dir() / "queries.npz", allow_pickle=True)
    return [str(t) for t in loaded["texts"]], np.asarray(loaded["vectors"], dtype=np.float32)


def min_max_fuse(legs: list[tuple[np.ndarray, np.ndarray]], k: int = TOP_K) -> list[int]:
    """Equal-weight fusion of min-max normalised legs (``retrieval.recall.fuse``: equal scores
    or one hit all become 1, ties broken by id); ``legs`` are ``(rows, scores)``; returns the
    top ``k`` rows."""
    fused: dict[int, float] = {}
    weight = 1.0 / max(len(legs), 1)
    for rows, scores in legs:
        if len(rows) == 0:
            continue
        low, high = float(scores.min()), float(scores.max())
        span = high - low
        for row, score in zip(rows.tolist(), scores.tolist(), strict=True):
            value = 1.0 if span <= 1e-12 else (score - low) / span
            fused[row] = fused.get(row, 0.0) + value * weight
    ranked = sorted(fused.items(), key=lambda item: (-item[1], item[0]))
    return [row for row, _ in ranked[:k]]


def percentiles(values: list[float]) -> dict:
    """p50 / p95 / mean in ms (linear interpolation, as ``retrieval.evaluation.percentile``)."""
    if not values:
        return {"p50_ms": None, "p95_ms": None, "mean_ms": None}
    array = np.asarray(values, dtype=np.float64)
    return {
        "p50_ms": round(float(np.percentile(array, 50)), 2),
        "p95_ms": round(float(np.percentile(array, 95)), 2),
        "mean_ms": round(float(array.mean()), 2),
    }


def wait_for_quiet(max_load: float, max_wait_s: float) -> dict:
    """Wait (up to ``max_wait_s``) until the 1-minute load average is below ``max_load``;
    returns the load seen and the seconds waited (the timed phase runs either way)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - t0 < max_wait_s:
        time.sleep(5)
    return {
        "load_avg": [round(v, 2) for v in os.getloadavg()],
        "waited_s": round(time.monotonic() - t0, 1),
        "quiet": os.getloadavg()[0] < max_load,
    }
