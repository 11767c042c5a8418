"""Retrieval evaluation on BEIR-format datasets (corpus.jsonl[.gz], queries.jsonl, qrels/SPLIT.tsv).

Each corpus record becomes one document whose text is ``title + " " + text`` (BEIR's convention),
admitted and compiled through the ordinary ingestion services into an evaluation space. The space
is reused while the dataset files, the embedding model and the chunker are unchanged.

Metrics follow BEIR/pytrec_eval definitions over the ranked, de-duplicated list of documents the
retrieval returns (node hits mapped to their documents, first occurrence wins):
nDCG@10 with graded gains ``rel`` and a log2 discount, ideal DCG from the qrels; Recall@100 =
relevant retrieved in the top 100 / relevant; MRR@10 = 1 / rank of the first relevant hit.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from django.db import transaction

from ingestion.chunking import CHUNKER_VERSION
from ingestion.models import Document, DocumentState
from ingestion.services import compilation, documents
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput
from knowledgefs.runtime import get_embedding_model
from spaces.models import KnowledgeSpace
from spaces.services import Principal, create_space, delete_space

from .services import LEGS, retrieve

EVAL_TENANT = "kfs-eval"


def _open_text(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.suffix == ".gz"
        else path.open(encoding="utf-8")
    )


def load_dataset(dataset_dir: Path, split: str) -> tuple[Path, list[dict], dict[str, str], dict]:
    """Read a BEIR dataset; returns ``(corpus_path, corpus, queries, qrels)``.

    ``qrels`` maps query id → {doc id: relevance}; only queries with judgments are kept.
    Raises :class:`InvalidInput` naming the missing file.
    """
    corpus_path = next(
        (p for p in (dataset_dir / "corpus.jsonl.gz", dataset_dir / "corpus.jsonl") if p.exists()),
        None,
    )
    queries_path = dataset_dir / "queries.jsonl"
    qrels_path = dataset_dir / "qrels" / f"{split}.tsv"
    for required, label in (
        (corpus_path, "corpus.jsonl[.gz]"),
        (queries_path, "queries.jsonl"),
        (qrels_path, f"qrels/{split}.tsv"),
    ):
        if required is None or not Path(required).exists():
            raise InvalidInput(f"{dataset_dir} has no {label}", code="dataset_incomplete")
    with _open_text(corpus_path) as handle:
        corpus = [json.loads(line) for line in handle if line.strip()]
    with queries_path.open(encoding="utf-8") as handle:
        queries = {str(q["_id"]): q["text"] for q in map(json.loads, handle) if q}
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as handle:
        for line in handle:
            parts = line.strip().split("\t")
            if len(parts) != 3 or parts[0] == "query-id":
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return corpus_path, corpus, queries, qrels


def ndcg_at_k(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    """nDCG@k with gains ``rel`` and discount ``1/log2(rank+1)``."""
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at_k(ranked: list[str], relevant: dict[str, int], k: int = 100) -> float:
    positives = {d for d, r in relevant.items() if r > 0}
    return len(positives & set(ranked[:k])) / len(positives) if positives else 0.0


def mrr_at_k(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if relevant.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def _fingerprint(corpus_path: Path) -> str:
    digest = hashlib.sha256()
    with corpus_path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    digest.update(get_embedding_model().model_id.encode())
    digest.update(CHUNKER_VERSION.encode())
    return digest.hexdigest()[:12]


def prepare_space(
    corpus_path: Path,
    corpus: list[dict],
    *,
    fresh: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> tuple[KnowledgeSpace, float, bool]:
    """Ingest the corpus into its evaluation space, or reuse it.

    Returns ``(space, ingest_seconds, reused)``.
    """
    principal = Principal(tenant_id=EVAL_TENANT)
    slug = f"eval-{corpus_path.parent.name.lower()}-{_fingerprint(corpus_path)}"
    slug = "-".join(filter(None, "".join(c if c.isalnum() else "-" for c in slug).split("-")))
    space = KnowledgeSpace.objects.filter(tenant_id=EVAL_TENANT, slug=slug).first()
    if space is not None and fresh:
        delete_space(principal, space.id)
        space = None
    if space is not None:
        published = Document.objects.filter(space=space, state=DocumentState.PUBLISHED).count()
        if published == Document.objects.filter(space=space).count() and published:
            return space, 0.0, True
        delete_space(principal, space.id)
    space = create_space(principal, name=f"Evaluation {corpus_path.parent.name}", slug=slug)
    started = time.perf_counter()
    for n, record in enumerate(corpus, 1):
        corpus_id = str(record["_id"])
        text = f"{record.get('title', '')} {record.get('text', '')}".strip()
        try:
            documents.admit_document(
                space,
                filename=f"{corpus_id}.txt",
                data=text.encode("utf-8"),
                metadata={"corpus_ids": [corpus_id]},
                enqueue=False,
            )
        except Conflict as exc:  # identical text under two ids: both ids map to one document
            with transaction.atomic():
                doc = lock_for_update(Document.objects).get(id=exc.details["existing_document_id"])
                doc.metadata["corpus_ids"].append(corpus_id)
                doc.save(update_fields=["metadata"])
        except InvalidInput:
            continue  # empty record
        if on_progress and n % 100 == 0:
            on_progress("admit", n, len(corpus))
    total = Document.objects.filter(space=space).count()
    done = 0

    def compiled(count: int) -> None:
        nonlocal done
        done += count
        if on_progress:
            on_progress("compile", done, total)

    compilation.drain_queued(space.id, on_progress=compiled)
    return space, time.perf_counter() - started, False


def evaluate(
    dataset_dir: Path,
    *,
    split: str = "test",
    mode: str = "fast",
    legs: tuple[str, ...] = LEGS,
    fusion: str = "minmax",
    fresh: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Run the evaluation; returns the metrics dict printed by ``kfs eval``."""
    corpus_path, corpus, queries, qrels = load_dataset(dataset_dir, split)
    space, ingest_seconds, reused = prepare_space(
        corpus_path, corpus, fresh=fresh, on_progress=on_progress
    )
    corpus_ids = {
        doc_id: meta.get("corpus_ids", [])
        for doc_id, meta in Document.objects.filter(space=space).values_list("id", "metadata")
    }
    ndcg, recall, mrr, latencies = [], [], [], []
    judged = [q for q in qrels if q in queries]
    for n, query_id in enumerate(judged, 1):
        t0 = time.perf_counter()
        result = retrieve(space, queries[query_id], top_k=100, mode=mode, legs=legs, fusion=fusion)
        latencies.append((time.perf_counter() - t0) * 1000)
        ranked: list[str] = []
        seen: set[str] = set()
        for item in result.items:
            for cid in corpus_ids.get(uuid.UUID(item.citation["document_id"]), []):
                if cid not in seen:
                    seen.add(cid)
                    ranked.append(cid)
        relevant = qrels[query_id]
        ndcg.append(ndcg_at_k(ranked, relevant, 10))
        recall.append(recall_at_k(ranked, relevant, 100))
        mrr.append(mrr_at_k(ranked, relevant, 10))
        if on_progress and n % 25 == 0:
            on_progress("query", n, len(judged))
    latencies.sort()
    return {
        "dataset": dataset_dir.name,
        "split": split,
        "mode": mode,
        "legs": "+".join(legs),
        "fusion": fusion if len(legs) > 1 else None,
        "ndcg@10": round(statistics.fmean(ndcg), 4) if ndcg else 0.0,
        "recall@100": round(statistics.fmean(recall), 4) if recall else 0.0,
        "mrr@10": round(statistics.fmean(mrr), 4) if mrr else 0.0,
        "queries": len(judged),
        "documents": len(corpus_ids),
        "nodes": space.nodes.count(),
        "space": space.slug,
        "reused_space": reused,
        "ingest_seconds": round(ingest_seconds, 2),
        "query_p50_ms": round(_percentile(latencies, 50), 2),
        "query_p95_ms": round(_percentile(latencies, 95), 2),
    }


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    rank = max(0, min(len(values) - 1, math.ceil(pct / 100 * len(values)) - 1))
    return values[rank]
