"""The latency floor of a Fast query on this CPU, on exactly the data of ``bench/scale_curve.py``
(``STATE/source.pkl`` copied with the seeded noise of ``scale.state.copy_vectors``, the claims'
precomputed vectors of ``STATE/queries.npz``; ``STATE`` is ``KFS_SCALE_VAR``, default
``/work/scale-var``, made by ``scale_curve.py prepare``).

Exact floor: bm25s keyword top 50 + numpy float32 matrix-vector product and ``argpartition``
dense top 50, min-max fusion (as ``retrieval.recall.fuse``), top 10. HNSW floor: the same with
FAISS ``IndexHNSWFlat`` (M 16, efConstruction 64; efSearch the smallest of a sweep with dense
recall@10 ≥ 0.99 against exact at that size). Query embedding excluded, query tokenization
included. bm25s, PyStemmer and faiss-cpu live in their own venv (``var/bench-floor-venv``,
``bench/requirements-floor.txt``), never in the project's dependencies; each size runs in its
own child process there. Each timed phase waits for the 1-minute load average to fall below
``--max-load`` (up to ``--max-wait`` s; the load seen is recorded); p50/p95 are the medians
over ``--rounds`` passes of the queries.

Usage::

    python bench/floor.py --sizes 10000,100000
    # → bench/results/floor-<date>.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from floorpeers.common import (
    BENCH,
    ROOT,
    ensure_venv,
    finish,
    installed_versions,
    log,
    run_child,
)

VENV = ROOT / "var" / "bench-floor-venv"
REQUIREMENTS = BENCH / "requirements-floor.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--max-load", type=float, default=3.0)
    parser.add_argument("--max-wait", type=float, default=600)
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per size")
    parser.add_argument("--venv", default=str(VENV))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    python = ensure_venv(Path(args.venv), REQUIREMENTS)
    versions = installed_versions(python)
    results = []
    for size in sorted(int(s) for s in args.sizes.split(",") if s.strip()):
        log(f"floor {size}: start")
        child_args = ["--size", str(size), "--queries", str(args.queries),
                      "--rounds", str(args.rounds), "--warmup", str(args.warmup),
                      "--max-load", str(args.max_load),
                      "--max-wait", str(args.max_wait)]  # fmt: skip
        point = run_child(python, "floor_child.py", child_args, args.timeout, args.blas_threads)
        log(f"floor {size}: {point.get('error') or 'done'}")
        results.append(point)
    return finish(
        "floor",
        "Fast latency floor: bm25s + numpy exact / FAISS HNSW dense, min-max fusion",
        {k: versions.get(k) for k in ("numpy", "bm25s", "pystemmer", "faiss-cpu")},
        "sizes",
        results,
        args,
    )


if __name__ == "__main__":
    sys.exit(main())
