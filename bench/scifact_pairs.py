"""Composite questions from SciFact: does Research beat Fast where decomposition helps?

Each SciFact test claim is one clause, so ``kfs eval`` cannot see Research's multi-query path
(Research's order equals Fast's there). This benchmark joins pairs of test claims into one
two-part question, ``"<claim A>; and <claim b>"`` (claim A without its final full stop, claim B
with a lower-case first letter), whose relevant documents are the union of both claims' qrels
(graded as in the qrels). Pairs are consecutive claims in query-id order (1st+2nd, 3rd+4th, …),
skipping a pair whose claims share a relevant document; ``--pairs`` bounds how many.

Every question runs in each mode of ``--modes`` with ``top_k=10`` and no threshold, over the
``kfs eval`` evaluation space (:func:`retrieval.evaluation.prepare_space`, the same compiled
space as ``kfs eval ../shared/data/scifact``); it prints nDCG@10 and Recall@10 per mode (BEIR
definitions, documents de-duplicated, :mod:`retrieval.evaluation`), how many questions each mode
ranks below / above Fast by nDCG@10, the query p50 and how many questions Research split.

The space must exist already (run ``kfs eval`` on the dataset once): the script only queries,
unless ``--allow-ingest`` lets it compile the space.

Usage: ``python bench/scifact_pairs.py [--dataset DIR] [--pairs 100]
[--modes fast,research,deep] [--allow-ingest] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")


def composite_pairs(queries: dict, qrels: dict, limit: int) -> list[tuple[str, dict]]:
    """``[(question, relevance)]``: consecutive judged claims joined as described above."""
    judged = sorted(q for q in qrels if q in queries)
    pairs = []
    for i in range(0, len(judged) - 1, 2):
        a, b = judged[i], judged[i + 1]
        if set(qrels[a]) & set(qrels[b]):
            continue
        first = queries[a].strip().rstrip(".")
        second = queries[b].strip()
        question = f"{first}; and {second[:1].lower()}{second[1:]}"
        pairs.append((question, {**qrels[a], **qrels[b]}))
        if len(pairs) >= limit:
            break
    return pairs


def main() -> int:
    import django

    django.setup()
    from retrieval.evaluation import (
        EVAL_TENANT,
        load_dataset,
        ndcg_at_k,
        percentile,
        prepare_space,
        recall_at_k,
        space_slug,
    )
    from retrieval.modes import retrieve
    from spaces.models import KnowledgeSpace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--modes", default="fast,research,deep")
    parser.add_argument("--allow-ingest", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dataset = Path(args.dataset)
    if not dataset.exists():
        print(f"dataset not found: {dataset}", file=sys.stderr)
        return 2
    corpus_path, corpus, queries, qrels = load_dataset(dataset, "test")
    slug = space_slug(corpus_path)
    if (
        not args.allow_ingest
        and not KnowledgeSpace.objects.filter(tenant_id=EVAL_TENANT, slug=slug).exists()
    ):
        print(f"no evaluation space {slug}: run kfs eval {dataset} first", file=sys.stderr)
        return 2
    space, _, _ = prepare_space(corpus_path, corpus)
    corpus_ids = {
        doc_id: meta.get("corpus_ids", [])
        for doc_id, meta in space.documents.values_list("id", "metadata")
    }
    pairs = composite_pairs(queries, qrels, args.pairs)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    scores: dict[str, dict[str, list[float]]] = {
        m: {"ndcg": [], "recall": [], "ms": []} for m in modes
    }
    split = 0
    for question, relevant in pairs:
        for mode in modes:
            t0 = time.perf_counter()
            result = retrieve(space, question, top_k=10, mode=mode, score_threshold=None)
            scores[mode]["ms"].append((time.perf_counter() - t0) * 1000)
            if mode == "research":
                split += len(result.plan["queries"]) > 1
            ranked: list[str] = []
            for item in result.items:
                for cid in corpus_ids.get(uuid.UUID(item.citation["document_id"]), []):
                    if cid not in ranked:
                        ranked.append(cid)
            scores[mode]["ndcg"].append(ndcg_at_k(ranked, relevant, 10))
            scores[mode]["recall"].append(recall_at_k(ranked, relevant, 10))
    summary = {"pairs": len(pairs), "research_split": split, "modes": {}}
    for mode in modes:
        row = scores[mode]
        base = scores.get("fast", row)["ndcg"]
        summary["modes"][mode] = {
            "ndcg@10": round(statistics.fmean(row["ndcg"]), 4),
            "recall@10": round(statistics.fmean(row["recall"]), 4),
            "below_fast": sum(1 for x, y in zip(row["ndcg"], base, strict=True) if x < y - 1e-9),
            "above_fast": sum(1 for x, y in zip(row["ndcg"], base, strict=True) if x > y + 1e-9),
            "query_p50_ms": round(percentile(sorted(row["ms"]), 50), 1),
        }
    print(json.dumps(summary, indent=2))
    print("\n| mode | nDCG@10 | Recall@10 | below Fast | above Fast | p50 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, row in summary["modes"].items():
        print(
            f"| {mode} | {row['ndcg@10']} | {row['recall@10']} | {row['below_fast']} | "
            f"{row['above_fast']} | {row['query_p50_ms']} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
