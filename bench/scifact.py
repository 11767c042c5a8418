"""SciFact benchmark: retrieval quality per leg, ingest throughput and query latency.

Runs ``kfs eval``'s service on BEIR SciFact (``../shared/data/scifact`` or ``--dataset``) for
keyword-only, dense-only and hybrid Fast retrieval (min-max fusion, and RRF for comparison; one
ingest, the space is reused), then times the raw embedding of the very chunk texts the ingest
produced with the same model and batching.
The ingest/raw ratio says how much of the compilation time is the model itself.

Usage: ``python bench/scifact.py [--dataset DIR] [--fresh] [--out bench/results/FILE.json]``.
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
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dataset = Path(args.dataset)
    if not dataset.exists():
        print(f"dataset not found: {dataset}", file=sys.stderr)
        return 2
    call_command("migrate", verbosity=0)

    runs = {}
    for legs, fusion, name in (
        (("dense", "keyword"), "minmax", "hybrid"),
        (("keyword",), "minmax", "keyword"),
        (("dense",), "minmax", "dense"),
        (("dense", "keyword"), "rrf", "hybrid-rrf"),
    ):
        runs[name] = evaluate(
            dataset, split="test", legs=legs, fusion=fusion, fresh=args.fresh and name == "hybrid"
        )
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
