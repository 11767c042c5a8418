"""SciFact benchmark: retrieval quality per mode and leg, ingest throughput and query latency.

Runs ``kfs eval``'s service on BEIR SciFact (``../shared/data/scifact`` or ``--dataset``) once
per retrieval mode of ``--modes`` (hybrid, min-max fusion: nDCG@10, Recall@100, MRR@10 and the
query p50/p95 in ms, under ``modes``; a mode that fails is recorded with its error), and, when
``fast`` is among them, for keyword-only, dense-only and RRF-fused Fast retrieval as well (one
ingest, the space is reused). Then it times the raw embedding of the very chunk texts the ingest
produced with the same model and batching. The ingest/raw ratio says how much of the compilation
time is the model itself.

Usage: ``python bench/scifact.py [--dataset DIR] [--modes fast,deep,research] [--fresh]
[--out bench/results/FILE.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")


def main() -> int:
    import django

    django.setup()
    from django.core.management import call_command

    from ingestion.models import KnowledgeNode
    from knowledgefs.runtime import get_embedding_model
    from retrieval.evaluation import evaluate
    from spaces.models import KnowledgeSpace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--modes", default="fast,deep,research")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dataset = Path(args.dataset)
    if not dataset.exists():
        print(f"dataset not found: {dataset}", file=sys.stderr)
        return 2
    call_command("migrate", verbosity=0)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    per_mode: dict[str, dict] = {}
    runs: dict[str, dict] = {}
    for n, mode in enumerate(modes):
        try:
            run = evaluate(dataset, split="test", mode=mode, fresh=args.fresh and n == 0)
        except Exception as exc:  # a mode not built yet, or failing: recorded, not fatal
            per_mode[mode] = {"error": f"{type(exc).__name__}: {exc}"}
            print(mode, json.dumps(per_mode[mode]), flush=True)
            continue
        per_mode[mode] = {
            k: run[k]
            for k in ("ndcg@10", "recall@100", "mrr@10", "query_p50_ms", "query_p95_ms", "queries")
        }
        print(mode, json.dumps(run), flush=True)
        if mode == "fast":
            runs["hybrid"] = run
    if "hybrid" not in runs:  # the leg comparison and the ingest figures need Fast's run
        runs["hybrid"] = evaluate(dataset, split="test", fresh=args.fresh and not per_mode)
    for legs, fusion, name in (
        (("keyword",), "minmax", "keyword"),
        (("dense",), "minmax", "dense"),
        (("dense", "keyword"), "rrf", "hybrid-rrf"),
    ):
        runs[name] = evaluate(dataset, split="test", legs=legs, fusion=fusion)
        print(name, json.dumps(runs[name]), flush=True)

    space = KnowledgeSpace.objects.get(slug=runs["hybrid"]["space"], tenant_id="kfs-eval")
    texts = list(
        KnowledgeNode.objects.filter(space=space)
        .order_by("document_id", "chunk_index")
        .values_list("text", flat=True)
    )
    model = get_embedding_model()
    model.embed_documents(texts[:64])  # warm-up
    started = time.perf_counter()
    for start in range(0, len(texts), 256):  # the compilation embeds in slices of 256
        model.embed_documents(texts[start : start + 256])
    raw_seconds = time.perf_counter() - started

    ingest_seconds = runs["hybrid"]["ingest_seconds"]
    result = {
        "date": dt.date.today().isoformat(),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "modes": per_mode,
        "runs": runs,
        "chunks": len(texts),
        "raw_embedding_seconds": round(raw_seconds, 2),
        "ingest_seconds": ingest_seconds,
        "ingest_to_raw_throughput_ratio": round(raw_seconds / ingest_seconds, 3)
        if ingest_seconds
        else None,
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"scifact-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print("\n| mode | nDCG@10 | Recall@100 | MRR@10 | p50 ms | p95 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, row in per_mode.items():
        if "error" in row:
            print(f"| {mode} | error: {row['error'][:60]} | | | | |")
        else:
            print(
                f"| {mode} | {row['ndcg@10']} | {row['recall@100']} | {row['mrr@10']} | "
                f"{row['query_p50_ms']} | {row['query_p95_ms']} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
