"""What one Fast (or Deep) query costs in process on the scale curve's SQLite data, wall and CPU.

Per size, a child process opens ``STATE/sqlite-<size>`` (``bench/scale_curve.py prepare`` and
``generate --engine sqlite``; ``KFS_SCALE_VAR``) with the code of ``--code`` (default: this
checkout; a checkout of the previous release gives the "before" row), and runs
``retrieval.modes.retrieve`` (mode ``fast``, ``top_k`` 10, both legs) over the first
``--queries`` SciFact claims of ``STATE/queries.npz``, ``--rounds`` times after ``--warmup``
untimed queries. The query embedding is left out: ``retrieval.recall.embed_queries`` answers
the claim's precomputed vector (the same vectors ``bench/floor.py`` gets). Per query it records
the wall time and this thread's CPU time (``time.thread_time``): on a shared machine whose load
average is above its core count the wall time mostly measures waiting, the CPU time does not
(``bench/floorpeers/floor_child.py`` records both for the floor). Medians over the rounds of
each round's p50 and p95; stage p50s from the result's ``stages``. ``--mode deep`` measures
Deep instead (the local cross-encoder on its top N, ``KNOWLEDGE_LOCAL_RERANK_TOP_N``); queries
whose rerank passed its deadline are counted (``rerank_degraded``).

Usage::

    KFS_SCALE_VAR=/work/scale-var python bench/fast_cost.py --sizes 10000,100000 \\
        [--code /path/to/previous/checkout] [--mode fast|deep|research] [--queries N] \\
        [--out bench/results/fast-cost-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    return Path(os.environ.get("KFS_SCALE_VAR", "/work/scale-var"))


def child(args) -> int:
    sys.path.insert(0, args.code)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    import django

    django.setup()
    import numpy as np

    from retrieval import recall
    from retrieval.modes import retrieve
    from spaces.models import KnowledgeSpace

    loaded = np.load(state_dir() / "queries.npz", allow_pickle=True)
    texts = [str(t) for t in loaded["texts"]]
    vectors = {t: v for t, v in zip(texts, loaded["vectors"], strict=True)}
    recall.embed_queries = lambda space, snapshot, batch: np.stack([vectors[t] for t in batch])
    space = KnowledgeSpace.objects.get(tenant_id="kfs-bench", slug=f"scale-{args.size}")
    t0 = time.perf_counter()
    retrieve(space, texts[-1], top_k=10, mode=args.mode)
    first_ms = (time.perf_counter() - t0) * 1000
    for text in texts[-args.warmup - 1 : -1]:
        retrieve(space, text, top_k=10, mode=args.mode)
    rounds = []
    degraded = 0
    for _ in range(args.rounds):
        wall, cpu, stages = [], [], {}
        for text in texts[: args.queries]:
            c0, t0 = time.thread_time(), time.perf_counter()
            result = retrieve(space, text, top_k=10, mode=args.mode)
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
            for s in result.stages:
                degraded += bool(s["name"] == "rerank" and s.get("degraded"))
                if s["status"] == "executed":
                    stages.setdefault(s["name"], []).append(s["duration_ms"])
        rounds.append(
            {
                "wall": _pct(wall),
                "cpu": _pct(cpu),
                "stage_p50_ms": {
                    k: round(float(np.percentile(v, 50)), 2) for k, v in stages.items()
                },
                "load_avg_end": [round(v, 2) for v in os.getloadavg()],
            }
        )
    out = {
        "size": args.size,
        "code": args.code,
        "mode": args.mode,
        "rerank_degraded": degraded,
        "queries": args.queries,
        "first_query_ms": round(first_ms, 1),
        **{
            f"{kind}_{p}_ms": round(float(np.median([r[kind][f"{p}_ms"] for r in rounds])), 2)
            for kind in ("wall", "cpu")
            for p in ("p50", "p95")
        },
        "rounds": rounds,
    }
    print(json.dumps(out))
    return 0


def _pct(values: list[float]) -> dict:
    import numpy as np

    return {
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p95_ms": round(float(np.percentile(values, 95)), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--code", default=str(ROOT))
    parser.add_argument("--mode", choices=["fast", "deep", "research"], default="fast")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child-size", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_size is not None:
        args.size = args.child_size
        return child(args)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        env = dict(
            os.environ,
            KNOWLEDGE_VAR_DIR=str(state_dir() / f"sqlite-{size}"),
            DJANGO_SETTINGS_MODULE="knowledgefs.settings",
        )
        env.pop("DATABASE_URL", None)
        cmd = [sys.executable, __file__, "--child-size", str(size), "--code", args.code,
               "--mode", args.mode, "--queries", str(args.queries), "--rounds", str(args.rounds),
               "--warmup", str(args.warmup)]  # fmt: skip
        load = os.getloadavg()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        row = {**json.loads(done.stdout.strip().splitlines()[-1]), "load_avg_start": load}
        print(
            f"{size} {args.mode}: wall p50/p95 {row['wall_p50_ms']}/{row['wall_p95_ms']} ms, "
            f"cpu p50/p95 {row['cpu_p50_ms']}/{row['cpu_p95_ms']} ms "
            f"(load {load[0]:.1f}; first query {row['first_query_ms']} ms)",
            flush=True,
        )
        results.append(row)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    out = Path(args.out or ROOT / "bench" / "results" / f"{args.mode}-cost-{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"code": args.code, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
