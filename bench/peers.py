"""LlamaIndex and Haystack on the Fast latency table, re-run on the data of
``bench/scale_curve.py`` (``STATE/source.pkl`` with its seeded noisy copies, the claims'
precomputed vectors of ``STATE/queries.npz``; ``STATE`` is ``KFS_SCALE_VAR``, default
``/work/scale-var``): a hybrid top-10 query with 50 candidates per leg, query embedding excluded
(the precomputed vector is passed in), per framework and size in its own child process.

The frameworks live in their own venv (``var/bench-peers-venv``, pinned in
``bench/requirements-peers.txt``), never in the project's dependencies. What each child builds:
``bench/floorpeers/peers_child.py``. Each timed phase waits for the 1-minute load average to
fall below ``--max-load`` (up to ``--max-wait`` s; recorded).

Usage::

    python bench/peers.py --sizes 10000,100000
    # → bench/results/peers-<date>.json
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

VENV = ROOT / "var" / "bench-peers-venv"
REQUIREMENTS = BENCH / "requirements-peers.txt"
RECORDED = ("llama-index-core", "llama-index-retrievers-bm25", "haystack-ai", "bm25s",
            "pystemmer", "numpy")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--frameworks", default="llamaindex,haystack")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-load", type=float, default=3.0)
    parser.add_argument("--max-wait", type=float, default=600)
    parser.add_argument("--max-seconds", type=int, default=1800, help="per timed round")
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--venv", default=str(VENV))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    python = ensure_venv(Path(args.venv), REQUIREMENTS)
    versions = installed_versions(python)
    results = []
    for size in sorted(int(s) for s in args.sizes.split(",") if s.strip()):
        for framework in args.frameworks.split(","):
            log(f"{framework} {size}: start")
            child_args = ["--framework", framework, "--size", str(size),
                          "--queries", str(args.queries), "--rounds", str(args.rounds),
                          "--warmup", str(args.warmup), "--max-load", str(args.max_load),
                          "--max-wait", str(args.max_wait),
                          "--max-seconds", str(args.max_seconds)]  # fmt: skip
            timeout = args.rounds * (args.max_seconds + args.max_wait) + 3600
            point = run_child(
                python, "peers_child.py", child_args, int(timeout), args.blas_threads,
                {"HAYSTACK_TELEMETRY_ENABLED": "False"},
            )  # fmt: skip
            point.setdefault("framework", framework)
            point.setdefault("size", size)
            log(f"{framework} {size}: {point.get('error') or 'done'}")
            results.append(point)
    return finish(
        "peers",
        "LlamaIndex and Haystack hybrid top 10 (50 per leg), query embedding excluded",
        {k: versions.get(k) for k in RECORDED},
        "results",
        results,
        args,
    )


if __name__ == "__main__":
    sys.exit(main())
