"""Scale curve state and the engine-independent data: the ``STATE`` directory
(``KFS_SCALE_VAR``, default ``/work/scale-var``) with ``state.json`` of finished points (merged
under a file lock), the exported source, the load layout and the copies' vectors and ids
(uuid5 of copy and source, so both engines hold the same ids)."""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import sys
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TENANT = "kfs-bench"
EVAL_TENANT = "kfs-eval"
NOISE_SIGMA = 0.02  # per dimension; a copy's cosine to its source is about 0.93 (384-d)
SEED = 20261130
DEPTH = 50  # Fast's dense leg at top_k 10: min(max(10 × 1, 50), 100) (retrieval.planner)
DOC_NAMESPACE = uuid.UUID("5d0c7b8e-3f0a-4f4e-9a55-6a3c2a1f0b11")
BATCH_DOCUMENTS = 1000
# ``ef_search`` values swept besides the configured one (``KFS_SCALE_EF_SWEEP_VALUES=a,b,…``
# replaces them; PostgreSQL caps them at 1000, SQLite's graph takes them as given).
EF_SEARCH_SWEEP = tuple(
    int(v) for v in os.environ.get("KFS_SCALE_EF_SWEEP_VALUES", "40,200,400,800,1000").split(",")
)


# --- state -------------------------------------------------------------------------------------
def state_dir() -> Path:
    return Path(os.environ.get("KFS_SCALE_VAR", "/work/scale-var"))


def load_state() -> dict:
    path = state_dir() / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_point(phase: str, engine: str, size: int, data: dict) -> None:
    """Record one finished point (merged into ``state.json`` under a file lock)."""
    import fcntl

    with (state_dir() / "state.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _save_point(phase, engine, size, data)


def _save_point(phase: str, engine: str, size: int, data: dict) -> None:
    state = load_state()
    state.setdefault(phase, {}).setdefault(engine, {})[str(size)] = data
    path = state_dir() / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def log(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[{stamp} load {os.getloadavg()[0]:.2f}] {message}", flush=True)


# --- source, layout and vectors (engine-independent) ---------------------------------------------
def load_source() -> dict:
    with (state_dir() / "source.pkl").open("rb") as handle:
        return pickle.load(handle)


def layout(source: dict, size: int) -> list[tuple[int, int]]:
    """``(copy, document index)`` in load order until the chunks reach ``size`` (the last
    document may carry past it)."""
    counts = [len(d["nodes"]) for d in source["documents"]]
    out, total, copy = [], 0, 1
    while total < size:
        for index, count in enumerate(counts):
            if total >= size:
                break
            out.append((copy, index))
            total += count
        copy += 1
    return out


def copy_vectors(source: dict, copy: int) -> np.ndarray:
    """Every source vector for copy ``copy``: source + N(0, NOISE_SIGMA²) per dimension,
    renormalised to unit length; seeded by ``(SEED, copy)``, so any engine and any batching
    get the same float32 rows."""
    base = source["vectors"]
    rng = np.random.default_rng([SEED, copy])
    noisy = base + rng.standard_normal(base.shape, dtype=np.float32) * np.float32(NOISE_SIGMA)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return noisy.astype(np.float32)


def copy_ids(source: dict, copy: int, index: int) -> tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]:
    """``(document id, generation, node ids)`` of copy ``copy`` of document ``index``."""
    from ingestion.compilation.generations import _NODE_NAMESPACE

    doc = source["documents"][index]
    document_id = uuid.uuid5(DOC_NAMESPACE, f"doc:{copy}:{doc['id']}")
    generation = uuid.uuid5(DOC_NAMESPACE, f"gen:{copy}:{doc['id']}")
    nodes = [uuid.uuid5(_NODE_NAMESPACE, f"{generation}:{n['chunk_index']}") for n in doc["nodes"]]
    return document_id, generation, nodes


def summary(data: dict) -> dict:
    return {k: v for k, v in data.items() if not isinstance(v, list | dict)}


def parse_sizes(text: str) -> list[int]:
    return sorted(int(s) for s in text.split(",") if s.strip())
