"""Soak: compile real documents on a real worker cluster that is SIGKILLed every few seconds.

On the embedded default (SQLite in ``KNOWLEDGE_VAR_DIR``, local object files, the local ONNX
embedding model) this admits the first ``--docs`` SciFact abstracts (``title`` and ``text`` as
one ``.txt`` each) plus every file of ``../shared/data`` the service accepts, through
``admit_document`` with ``enqueue=True`` (the real claim-before-enqueue dispatch). Then it starts
``manage.py qcluster`` as a child process group and, every 3–8 seconds (seeded), SIGKILLs the
whole group and restarts it at once, while this driver runs ``recover_jobs()`` every 5 seconds
in place of the every-minute schedule. Killing stops once every job is terminal or after
``--cap-minutes``; the cluster then runs on without kills until every job is terminal (or
``--settle-minutes`` pass).

A clean pass (the same documents in a fresh space, the same cluster settings, no kills) runs
first, so the soak's wall time has a baseline.

Checked and reported: documents admitted / published / failed (by error code) / stuck (a
non-terminal job at the end) / lost (an admitted document missing, or without a terminal latest
job); node counts per document against a clean parse+chunk of the same bytes done here; nodes
and parse artifacts of non-active generations; keyword and dense projection counts against the
node count; the kills; and, for every job a killed cluster held, the time from the kill until
the job was claimed again and until it next reached a checkpoint or ended.

Usage (own state directory; the soak takes 10–20 minutes)::

    KNOWLEDGE_VAR_DIR=/work/bench-var-soak python bench/soak.py [--docs 240] [--seed 7]
        [--cap-minutes 20] [--skip-clean] [--out bench/results/FILE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

from soak_cluster import POLL_SECONDS, SWEEP_SECONDS, run_pass
from soak_documents import ROOT, corpus

sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")


def compact(result: dict, detail: Path) -> dict:
    """The result without per-job lists (those stay in ``detail``, beside the cluster logs)."""
    result = json.loads(json.dumps(result, default=str))
    result["per_job_detail"] = str(detail)
    for name in ("clean", "soak"):
        run = result.get(name)
        if not run:
            continue
        run["recovery"].pop("detail", None)
        run["kill_log"] = [
            {
                **{k: v for k, v in kill.items() if k not in ("held_jobs", "cluster_pids")},
                "held_jobs": len(kill["held_jobs"]),
                "held_by_stage": dict(Counter(kill["held_jobs"].values())),
            }
            for kill in run["kill_log"]
        ]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=240, help="SciFact abstracts to admit")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lease", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cap-minutes", type=float, default=20)
    parser.add_argument("--settle-minutes", type=float, default=5)
    parser.add_argument(
        "--batch-documents", type=int, default=None, help="KNOWLEDGE_COMPILE_BATCH_DOCUMENTS"
    )
    parser.add_argument("--max-attempts", type=int, default=None, help="KNOWLEDGE_JOB_MAX_ATTEMPTS")
    parser.add_argument("--skip-clean", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    if "KNOWLEDGE_VAR_DIR" not in os.environ:
        print("set KNOWLEDGE_VAR_DIR to a state directory of your own", file=sys.stderr)
        return 2
    os.environ["KNOWLEDGE_JOB_LEASE_SECONDS"] = str(args.lease)
    os.environ["KNOWLEDGE_WORKERS"] = str(args.workers)
    if args.batch_documents:
        os.environ["KNOWLEDGE_COMPILE_BATCH_DOCUMENTS"] = str(args.batch_documents)
    if args.max_attempts:
        os.environ["KNOWLEDGE_JOB_MAX_ATTEMPTS"] = str(args.max_attempts)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    var_dir = Path(settings.VAR_DIR)
    env = {**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO")}
    items, source = corpus(args.docs)
    stamp = dt.datetime.now().strftime("%Y%m%d%H%M%S")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip() or os.environ.get("KFS_SOURCE_COMMIT", "")  # a `git archive` snapshot
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    result: dict = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "git_head": head,
        "working_tree_modified_files": [line[3:] for line in dirty if line.strip()],
        "config": {
            "database": str(settings.DATABASES["default"]["NAME"]),
            "lease_seconds": settings.KNOWLEDGE_JOB_LEASE_SECONDS,
            "workers": settings.Q_CLUSTER["workers"],
            "embedding_threads_per_worker": max(1, (os.cpu_count() or 1) // args.workers),
            "compile_batch_documents": settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS,
            "max_attempts": settings.KNOWLEDGE_JOB_MAX_ATTEMPTS,
            "kill_interval_seconds": [3, 8],
            "seed": args.seed,
            "driver_sweep_every_seconds": SWEEP_SECONDS,
            "poll_seconds": POLL_SECONDS,
            "cap_minutes": args.cap_minutes,
            "settle_minutes": args.settle_minutes,
        },
        "source": source,
        "documents_offered": len(items),
    }
    if not args.skip_clean:
        result["clean"] = run_pass(
            "clean",
            items,
            env=env,
            var_dir=var_dir,
            kill=False,
            seed=args.seed,
            cap_minutes=args.cap_minutes,
            settle_minutes=args.settle_minutes,
            stamp=stamp,
        )
    result["soak"] = run_pass(
        "soak",
        items,
        env=env,
        var_dir=var_dir,
        kill=True,
        seed=args.seed,
        cap_minutes=args.cap_minutes,
        settle_minutes=args.settle_minutes,
        stamp=stamp,
    )
    clean_wall = result.get("clean", {}).get("wall_seconds_cluster_start_to_all_terminal")
    soak_wall = result["soak"]["wall_seconds_cluster_start_to_all_terminal"]
    if clean_wall and soak_wall:
        result["soak_to_clean_wall_ratio"] = round(soak_wall / clean_wall, 2)
    soak = result["soak"]
    result["never_stuck"] = (
        soak["stuck"] == 0
        and soak["lost"] == 0
        and soak["duplicated"] == 0
        and soak["nodes_of_non_active_generations"] == 0
        and soak["projections_equal_nodes"]
    )
    detail = var_dir / f"soak-detail-{stamp}.json"
    detail.write_text(json.dumps(result, default=str) + "\n")
    out = Path(args.out or ROOT / "bench" / "results" / f"soak-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(compact(result, detail), indent=2, default=str) + "\n")
    print(f"wrote {out} (per job detail: {detail}); never_stuck={result['never_stuck']}")
    return 0 if result["never_stuck"] else 1


if __name__ == "__main__":
    sys.exit(main())
