"""Known-item evaluation (``kfs eval --known-item``): can a user find the document a sentence or
an identifier they remember comes from?

The benchmark is built from the corpus itself. Over the evaluation space's published chunks,
documents are visited round-robin in a seeded random order; from a random chunk of each, one
target is drawn: a sentence of 6 to 40 words (:func:`retrieval.sentences.split_sentences`), or
every fifth time an identifier-like token (letters and digits, 4+ characters). A target that also
occurs in another document's text (compared case-insensitively, whitespace collapsed) is skipped,
so each has exactly one right answer. ``sample`` (300) targets at most.

Each target is one query with ``top_k=10`` and no threshold; success@1 is the share whose first
item cites the source document, MRR@10 the mean reciprocal rank of its first chunk.

Datasets: a BEIR folder (``corpus.jsonl[.gz]``: the ``kfs eval`` space, one document per record)
or a folder of documents of any supported type (``../shared/data/sample-docs``), admitted and
compiled into an evaluation space of their own (reused while the files, the embedding model and
the chunker are unchanged).
"""

from __future__ import annotations

import hashlib
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ingestion import documents
from ingestion.chunking import CHUNKER_VERSION
from ingestion.compilation.recovery import drain_queued
from ingestion.models import Document, DocumentState
from knowledgefs.errors import Conflict, InvalidInput
from knowledgefs.runtime import get_embedding_model
from spaces.models import KnowledgeSpace
from spaces.services import Principal, create_space, delete_space

from .calibration import DEFAULT_FUSION
from .modes import retrieve
from .sentences import split_sentences

SAMPLE = 300
SEED = 20
MISSES_SHOWN = 20  # the first targets not ranked first, named in the report (rank or None)
MIN_WORDS, MAX_WORDS = 6, 40
_IDENTIFIER = re.compile(
    r"(?<!\w)(?=[\w./-]*\d)(?=[\w./-]*[A-Za-z])[A-Za-z0-9][\w./-]{3,}(?<![./-])"
)


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def folder_space(
    folder: Path, *, fresh: bool = False, on_progress: Callable | None = None
) -> KnowledgeSpace:
    """The evaluation space of a folder of documents (admitted and compiled when needed)."""
    from .evaluation import EVAL_TENANT

    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower() != "readme.md")
    if not files:
        raise InvalidInput(f"{folder} holds no documents", code="dataset_incomplete")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(get_embedding_model().model_id.encode() + CHUNKER_VERSION.encode())
    slug = f"eval-files-{re.sub(r'[^a-z0-9]+', '-', folder.name.lower())}-{digest.hexdigest()[:12]}"
    principal = Principal(tenant_id=EVAL_TENANT)
    space = KnowledgeSpace.objects.filter(tenant_id=EVAL_TENANT, slug=slug).first()
    if space is not None and fresh:
        delete_space(principal, space.id)
        space = None
    if space is not None and not space.documents.exclude(
        state__in=[DocumentState.PUBLISHED, DocumentState.FAILED]
    ):
        return space
    if space is not None:
        delete_space(principal, space.id)
    space = create_space(principal, name=f"Evaluation {folder.name}", slug=slug)
    for path in files:
        try:
            documents.admit_document(
                space, filename=path.name, data=path.read_bytes(), enqueue=False
            )
        except (Conflict, InvalidInput):
            continue  # a duplicate or a refused file: not part of the benchmark
    drain_queued(space.id, on_progress=None)
    return space


def build_targets(space: KnowledgeSpace, sample: int = SAMPLE, seed: int = SEED) -> list[dict]:
    """``[{"query", "document_id", "kind": "sentence"|"identifier"}]`` (module docstring)."""
    rows = list(
        space.nodes.filter(
            document__state=DocumentState.PUBLISHED,
            generation=models_active_generation(),
        )
        .order_by("document__filename", "document_id", "chunk_index")
        .values_list("document_id", "text")
    )
    by_document: dict[uuid.UUID, list[str]] = {}
    for document_id, text in rows:
        by_document.setdefault(document_id, []).append(text)
    texts = {d: _norm("\n".join(chunks)) for d, chunks in by_document.items()}
    rng = random.Random(seed)
    # Documents in filename order (ids are random): the same corpus draws the same targets.
    order = list(by_document)
    rng.shuffle(order)
    targets: list[dict] = []
    used: set[str] = set()
    attempts = 0
    while len(targets) < sample and order and attempts < sample * 20:
        for document_id in list(order):
            if len(targets) >= sample:
                break
            attempts += 1
            chunk = rng.choice(by_document[document_id])
            kind = "identifier" if attempts % 5 == 0 else "sentence"
            candidates = (
                _IDENTIFIER.findall(chunk)
                if kind == "identifier"
                else [s for s in split_sentences(chunk) if MIN_WORDS <= len(s.split()) <= MAX_WORDS]
            )
            rng.shuffle(candidates)
            for candidate in candidates:
                key = _norm(candidate)
                if key in used or any(key in t for d, t in texts.items() if d != document_id):
                    continue
                used.add(key)
                targets.append({"query": candidate, "document_id": document_id, "kind": kind})
                break
        if attempts >= sample * 20:
            break
    return targets


def models_active_generation():
    """The documents' active generation, as a subquery on the node's document."""
    from django.db.models import F

    return F("document__active_generation")


def evaluate_known_item(
    dataset_dir: Path,
    *,
    mode: str = "fast",
    fusion: str = DEFAULT_FUSION,
    fresh: bool = False,
    sample: int = SAMPLE,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Run the known-item benchmark (module docstring) in one ``mode``; returns the metrics."""
    from .evaluation import load_dataset, percentile, prepare_space

    if (dataset_dir / "corpus.jsonl.gz").exists() or (dataset_dir / "corpus.jsonl").exists():
        corpus_path, corpus, _, _ = load_dataset(dataset_dir, "test")
        space, _, _ = prepare_space(corpus_path, corpus, fresh=fresh, on_progress=on_progress)
    elif dataset_dir.is_dir():
        space = folder_space(dataset_dir, fresh=fresh)
    else:
        raise InvalidInput(f"{dataset_dir} is not a folder", code="dataset_incomplete")
    targets = build_targets(space, sample)
    hits, reciprocal, latencies = [], [], []
    misses: list[dict] = []  # the targets not ranked first (at most MISSES_SHOWN)
    kinds: dict[str, list[int]] = {}
    degraded = 0  # queries whose local rerank passed its deadline (the fused order was served)
    for n, target in enumerate(targets, 1):
        t0 = time.perf_counter()
        result = retrieve(
            space, target["query"], top_k=10, mode=mode, fusion=fusion, score_threshold=None
        )
        latencies.append((time.perf_counter() - t0) * 1000)
        degraded += any(stage.get("degraded") for stage in result.stages)
        cited = [uuid.UUID(i.citation["document_id"]) for i in result.items]
        first = cited.index(target["document_id"]) + 1 if target["document_id"] in cited else 0
        hit = int(first == 1)
        hits.append(hit)
        if not hit and len(misses) < MISSES_SHOWN:
            misses.append({"query": target["query"], "kind": target["kind"], "rank": first or None})
        kinds.setdefault(target["kind"], []).append(hit)
        reciprocal.append(1 / first if first else 0.0)
        if on_progress and n % 25 == 0:
            on_progress("query", n, len(targets))
    latencies.sort()
    return {
        "kind": "known-item",
        "dataset": dataset_dir.name,
        "mode": mode,
        "fusion": fusion,
        "targets": len(targets),
        "documents": Document.objects.filter(space=space).count(),
        "success@1": round(statistics.fmean(hits), 4) if hits else 0.0,
        "mrr@10": round(statistics.fmean(reciprocal), 4) if reciprocal else 0.0,
        "success@1_by_kind": {k: round(statistics.fmean(v), 4) for k, v in sorted(kinds.items())},
        "rerank_degraded": degraded,
        "misses": misses,
        "query_p50_ms": round(percentile(latencies, 50), 2),
        "query_p95_ms": round(percentile(latencies, 95), 2),
        "space": space.slug,
    }
