"""Scale curve ``report``: recall of each engine's dense leg against the numpy ground truth, the
markdown table and ``bench/results/scale-curve-<date>.json``."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path

import numpy as np

from .measure import recall
from .state import DEPTH, NOISE_SIGMA, ROOT, SEED, load_state, parse_sizes, state_dir, summary


def cmd_report(args) -> int:
    state = load_state()
    rows = []
    for size in parse_sizes(args.sizes):
        truth_path = state_dir() / f"truth-{size}.npz"
        truth = np.load(truth_path)["ids"] if truth_path.exists() else None
        measured = state.get("measure", {})
        # The two engines, then their labelled variants measured at this size
        # (``postgres+<KFS_SCALE_KEYWORD>``: another keyword leg, a release, a prewarm).
        variants = sorted(e for e in measured if "+" in e and str(size) in measured[e])
        for engine in ("sqlite", "postgres", *variants):
            base = engine.split("+", 1)[0]
            gen = state.get("generate", {}).get(base, {}).get(str(size))
            meas = measured.get(engine, {}).get(str(size))
            if engine != base and not meas:
                continue
            row = {"size": size, "engine": engine, "generate": gen and summary(gen)}
            if gen:
                row["indexes_built"] = gen.get("indexes_built")
                rows_state = state.get("generate-rows", {}).get(base, {}).get(str(size))
                row["generate_rows"] = rows_state and {
                    "load_s": rows_state["load_s"],
                    "indexes_built": rows_state.get("indexes_built")
                    or rows_state.get("hnsw_indexes"),
                }
                row["storage"] = gen.get("sizes")
            if meas:
                row["measure"] = {
                    **summary(meas),
                    "load_avg_start": meas["load_avg_start"],
                    "load_avg_end": meas["load_avg_end"],
                }
                row["stage_p50_ms"] = meas["stage_p50_ms"]
                row["dense_plan"] = meas.get("dense_plan")
                if truth is not None:
                    row["recall@10"] = recall(meas["dense_ids"], truth, 10)
                    row["recall@50"] = recall(meas["dense_ids"], truth, 50)
                    row["ef_search_sweep"] = {
                        ef: {
                            "p50_ms": point["p50_ms"], "p95_ms": point["p95_ms"],
                            "recall@10": recall(point["ids"], truth, 10),
                            "recall@50": recall(point["ids"], truth, 50),
                        }
                        for ef, point in (meas.get("ef_search_sweep") or {}).items()
                    }  # fmt: skip
            rows.append(row)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "noise_sigma": NOISE_SIGMA,
        "seed": SEED,
        "depth": DEPTH,
        "points": rows,
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"scale-curve-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(rows))
    print(f"\nwritten: {out}")
    return 0


def _ms(value) -> str:
    return "–" if value is None else f"{value:,.1f} ms"


def _gib(value) -> str:
    return "–" if not value else f"{value / 2**30:.2f} GiB"


def _storage(row: dict) -> dict:
    """Database, dense-vector, ANN-index and keyword bytes of one point."""
    storage = row.get("storage") or {}
    rel = storage.get("relations") or {}
    if row["engine"] == "postgres":
        hnsw = sum(v["own"] for k, v in rel.items() if k.startswith("retrieval_dense_hnsw_"))
        dense = (rel.get("retrieval_densevector") or {}).get("total", 0) - hnsw
        keyword = (rel.get("retrieval_keyword_tsv") or {}).get("total", 0)
    else:
        hnsw = 0
        dense = sum(
            v["total"] for k, v in rel.items() if "densevector" in k or k.startswith("dense_")
        )
        keyword = sum(v["total"] for k, v in rel.items() if k.startswith("retrieval_keyword_fts"))
    return {"database": storage.get("database"), "dense": dense, "hnsw": hnsw, "keyword": keyword}


def _load(row: dict) -> str:
    """The load time; PostgreSQL's two steps (rows, then vectors) separately."""
    total = (row.get("generate") or {}).get("load_s")
    rows = (row.get("generate_rows") or {}).get("load_s")
    if total is None:
        return "–"
    if rows is None:
        return f"{total:,.0f} s"
    return f"{rows:,.0f} s + {total - rows:,.0f} s"


def markdown(rows: list[dict]) -> str:
    """Three tables: latency and recall; load, build and sizes; the ef_search sweep."""
    lines = [
        "| chunks | engine | Fast p50 | Fast p95 | Fast p50 / p95 without embedding "
        "| first query after a publish (p50) | Fast queries | dense leg p50 | dense leg p95 "
        "| keyword leg p50 (in Fast) | recall@10 | recall@50 | load avg (1 min) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row.get("measure") or {}
        if not m:
            lines.append(f"| {row['size']:,} | {row['engine']} | not measured |||||||||||")
            continue
        load = (m.get("load_avg_start") or [None])[0], (m.get("load_avg_end") or [None])[0]
        lines.append(
            f"| {row['size']:,} | {row['engine']} | {_ms(m.get('fast_p50_ms'))} | "
            f"{_ms(m.get('fast_p95_ms'))} | {_ms(m.get('fast_noembed_p50_ms'))} / "
            f"{_ms(m.get('fast_noembed_p95_ms'))} | "
            f"{_ms((m.get('after_publish') or {}).get('first_p50_ms'))} | "
            f"{m.get('queries_fast')} | "
            f"{_ms(m.get('dense_p50_ms'))} | {_ms(m.get('dense_p95_ms'))} | "
            f"{_ms((row.get('stage_p50_ms') or {}).get('keyword'))} | "
            f"{row.get('recall@10', '–')} | {row.get('recall@50', '–')} | "
            f"{load[0]:.1f} → {load[1]:.1f} |"
        )
    lines += [
        "",
        "| chunks | engine | load (PostgreSQL: rows + vectors) | index build "
        "| first dense query (cold) | database | dense vectors | HNSW index | keyword index |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row.get("measure") or {}
        built = row.get("indexes_built") or []
        build = " + ".join(f"{b['name'].split('_')[2]} {b['build_s']:.0f} s" for b in built)
        rows_part = (row.get("generate_rows") or {}).get("indexes_built") or []
        build = " + ".join(
            [f"{b['name'].split('_')[-1]} {b['build_s']:.0f} s" for b in rows_part]
            + ([build] if build else [])
        )
        st = _storage(row)
        lines.append(
            f"| {row['size']:,} | {row['engine']} | {_load(row)} | {build or '–'} | "
            f"{_ms(m.get('cold_dense_ms'))} | {_gib(st['database'])} | {_gib(st['dense'])} | "
            f"{_gib(st['hnsw'])} | {_gib(st['keyword'])} |"
        )
    sweep = [r for r in rows if r.get("ef_search_sweep")]
    if sweep:
        lines += [
            "",
            "| chunks | engine | ef_search | dense leg p50 | dense leg p95 | recall@10 "
            "| recall@50 |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for row in sweep:
            m = row["measure"]
            configured = f"{m.get('ef_search_configured', 400)} (configured, first pass)"
            points = {**row["ef_search_sweep"], configured: {
                "p50_ms": m.get("dense_p50_ms"), "p95_ms": m.get("dense_p95_ms"),
                "recall@10": row.get("recall@10"), "recall@50": row.get("recall@50")}}  # fmt: skip
            for ef in sorted(points, key=lambda e: int(e.split()[0])):
                p = points[ef]
                lines.append(
                    f"| {row['size']:,} | {row['engine']} | {ef} | {_ms(p['p50_ms'])} | "
                    f"{_ms(p['p95_ms'])} | "
                    f"{p['recall@10']} | {p['recall@50']} |"
                )
    return "\n".join(lines)
