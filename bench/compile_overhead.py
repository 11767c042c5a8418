"""Compilation cost beyond the model: in-process ingest time vs raw embedding of the same chunks.

Admits the first ``--docs`` SciFact records (title + abstract as one ``.txt`` each) into a fresh
space of a fresh SQLite database, compiles them with ``drain_queued`` (the worker's code path,
without the queue), then embeds the very chunk texts the compilation produced with the same
model and batching, ``--repeat`` times each. Reports medians, the ingest/raw ratio (closer to 1 =
less overhead) and the non-model overhead per document.

Run it from any checkout (``python bench/compile_overhead.py --out FILE``) to compare versions;
``KNOWLEDGE_VAR_DIR`` must point at an empty folder.

On a shared machine the model's own speed drifts by tens of percent between minutes, which moves
the ratio more than the pipeline does. The time spent inside the model's ``embed_documents``
during the ingest is therefore also recorded (the model object is wrapped with a timer); ingest
minus that time is the pipeline's own overhead, measured in the same minutes as the ingest, and
``raw / (raw + overhead)`` is reported beside the plain ratio as a steadier estimate of it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--label", default="", help="recorded in the result (e.g. a commit)")
    args = parser.parse_args()
    corpus = Path(args.dataset) / "corpus.jsonl.gz"
    if not corpus.exists():
        print(f"dataset not found: {corpus}", file=sys.stderr)
        return 2

    import django

    django.setup()
    from django.core.management import call_command

    from ingestion.compilation.recovery import drain_queued
    from ingestion.documents import admit_document
    from ingestion.models import KnowledgeNode
    from knowledgefs.runtime import get_embedding_model
    from spaces.services import create_space

    try:
        from knowledgefs.auth.principal import Principal
    except ImportError:  # checkouts before the move of Principal
        from spaces.services import Principal

    call_command("migrate", verbosity=0)
    records = []
    with gzip.open(corpus, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            records.append((row["_id"], f"{row.get('title', '')}\n\n{row['text']}"))
            if len(records) == args.docs:
                break
    model = get_embedding_model()
    model.embed_documents(["warm-up"] * 16)
    inside_model = [0.0]  # seconds spent in embed_documents since the last reset
    embed = model.embed_documents

    def timed_embed(texts):
        started = time.perf_counter()
        try:
            return embed(texts)
        finally:
            inside_model[0] += time.perf_counter() - started

    model.embed_documents = timed_embed  # the compile path gets this same cached instance
    ingest, ingest_model, raw, nodes = [], [], [], 0
    load_before = os.getloadavg()
    for run in range(args.repeat):
        space = create_space(Principal(tenant_id="bench"), name=f"overhead {run} {time.time()}")
        for doc_id, text in records:
            admit_document(space, filename=f"{doc_id}.txt", data=text.encode(), enqueue=False)
        inside_model[0] = 0.0
        started = time.perf_counter()
        drain_queued(space.id)
        ingest.append(time.perf_counter() - started)
        ingest_model.append(inside_model[0])
        texts = list(
            KnowledgeNode.objects.filter(space=space)
            .order_by("document_id", "chunk_index")
            .values_list("text", flat=True)
        )
        nodes = len(texts)
        started = time.perf_counter()
        for start in range(0, len(texts), 256):
            model.embed_documents(texts[start : start + 256])
        raw.append(time.perf_counter() - started)
        print(
            f"run {run}: ingest {ingest[-1]:.1f} s (model {ingest_model[-1]:.1f} s), "
            f"raw {raw[-1]:.1f} s",
            flush=True,
        )
    other = [i - m for i, m in zip(ingest, ingest_model, strict=True)]
    result = {
        "label": args.label,
        "checkout": str(ROOT),
        # The machine is shared: 1-, 5- and 15-minute load averages at the start and the end.
        "loadavg_start": [round(x, 2) for x in load_before],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "docs": len(records),
        "nodes": nodes,
        "ingest_seconds": ingest,
        "raw_seconds": raw,
        "ingest_median_s": statistics.median(ingest),
        "raw_median_s": statistics.median(raw),
        "raw_to_ingest_ratio": round(statistics.median(raw) / statistics.median(ingest), 3),
        "overhead_ms_per_doc": round(
            1000 * (statistics.median(ingest) - statistics.median(raw)) / len(records), 1
        ),
        "ingest_model_seconds": ingest_model,
        "ingest_other_seconds": other,
        "ingest_other_ms_per_doc": round(1000 * statistics.median(other) / len(records), 1),
        "raw_to_raw_plus_other_ratio": round(
            statistics.median(raw) / (statistics.median(raw) + statistics.median(other)), 3
        ),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
