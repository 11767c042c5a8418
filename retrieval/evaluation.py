"""Retrieval evaluation on BEIR-format datasets (corpus.jsonl[.gz], queries.jsonl, qrels/SPLIT.tsv).

Each corpus record becomes one document whose text is ``title + " " + text`` (BEIR's convention),
admitted and compiled through the ordinary ingestion services into an evaluation space. The space
is reused while the dataset files, the embedding model and the chunker are unchanged.

Metrics follow BEIR/pytrec_eval definitions over the ranked, de-duplicated list of documents the
retrieval returns (node hits mapped to their documents, first occurrence wins):
nDCG@10 with graded gains ``rel`` and a log2 discount, ideal DCG from the qrels; Recall@100 =
relevant retrieved in the top 100 / relevant; MRR@10 = 1 / rank of the first relevant hit.

The regression gate (:func:`check_gate`, :func:`write_baseline`, :func:`load_baseline`)
compares runs of ``kfs eval`` (BEIR, or golden questions: :mod:`retrieval.golden`) with a
baseline file per database engine and mode; the format is described above
:data:`BASELINE_FORMAT` and in docs/retrieval.md, "Evaluation".
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

from ingestion import documents
from ingestion.chunking import CHUNKER_VERSION
from ingestion.compilation.recovery import drain_queued
from ingestion.models import Document, DocumentState
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput
from knowledgefs.runtime import get_embedding_model
from spaces.models import KnowledgeSpace
from spaces.services import Principal, create_space, delete_space

from .calibration import DEFAULT_FUSION
from .modes import retrieve
from .recall import LEGS

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
    assert corpus_path is not None  # refused in the loop above
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
    """Relevant documents in the top ``k`` / relevant documents (0.0 without any)."""
    positives = {d for d, r in relevant.items() if r > 0}
    return len(positives & set(ranked[:k])) / len(positives) if positives else 0.0


def mrr_at_k(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    """``1 / rank`` of the first relevant document within the top ``k`` (0.0 if none)."""
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


def space_slug(corpus_path: Path) -> str:
    """The evaluation space's slug for a corpus file: ``eval-<dataset dir>-<fingerprint>``, the
    fingerprint covering the file's bytes, the embedding model and the chunker version."""
    slug = f"eval-{corpus_path.parent.name.lower()}-{_fingerprint(corpus_path)}"
    return "-".join(filter(None, "".join(c if c.isalnum() else "-" for c in slug).split("-")))


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
    slug = space_slug(corpus_path)
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
                doc = lock_for_update(Document.objects.all()).get(
                    id=exc.details["existing_document_id"]
                )
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

    drain_queued(space.id, on_progress=compiled)
    return space, time.perf_counter() - started, False


def evaluate(
    dataset_dir: Path,
    *,
    split: str = "test",
    mode: str = "fast",
    legs: tuple[str, ...] = LEGS,
    fusion: str = DEFAULT_FUSION,
    fresh: bool = False,
    top_k: int = 100,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Run the evaluation with one retrieval ``mode`` (``fast``, ``deep``, ``research`` or
    ``auto``: recorded as ``mode``, and the mode the retrieval reports as ``resolved_mode``) and
    ``top_k`` items per query (1..``RETRIEVAL_MAX_TOP_K``; Recall@100 counts what is returned).

    Returns the metrics dict printed by ``kfs eval``: ``ndcg@10``, ``recall@100``, ``mrr@10``
    (means over the judged queries, 4 decimals), ``query_p50_ms``/``query_p95_ms`` (wall time of
    :func:`retrieval.modes.retrieve`) and the run's description. ``mode`` and ``top_k`` are
    checked before anything is ingested.
    """

    from .recall import MODES, validate_top_k

    if mode not in MODES:
        raise InvalidInput(f"mode must be one of: {', '.join(MODES)}", code="invalid_mode")
    validate_top_k(top_k)
    corpus_path, corpus, queries, qrels = load_dataset(dataset_dir, split)
    space, ingest_seconds, reused = prepare_space(
        corpus_path, corpus, fresh=fresh, on_progress=on_progress
    )
    corpus_ids = {
        doc_id: meta.get("corpus_ids", [])
        for doc_id, meta in Document.objects.filter(space=space).values_list("id", "metadata")
    }
    ndcg, recall, mrr, latencies = [], [], [], []
    resolved: set[str] = set()
    degraded = 0  # queries whose local rerank passed its deadline (the fused order was served)
    judged = [q for q in qrels if q in queries]
    for n, query_id in enumerate(judged, 1):
        t0 = time.perf_counter()
        result = retrieve(
            space,
            queries[query_id],
            top_k=top_k,
            mode=mode,
            legs=legs,
            fusion=fusion,
            score_threshold=None,
        )
        latencies.append((time.perf_counter() - t0) * 1000)
        degraded += any(stage.get("degraded") for stage in result.stages)
        resolved.add(result.mode)
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
        "kind": "beir",
        "dataset": dataset_dir.name,
        "split": split,
        "mode": mode,
        "resolved_mode": ",".join(sorted(resolved)),
        "top_k": top_k,
        "legs": "+".join(legs),
        "fusion": fusion if len(legs) > 1 else None,
        "ndcg@10": round(statistics.fmean(ndcg), 4) if ndcg else 0.0,
        "recall@100": round(statistics.fmean(recall), 4) if recall else 0.0,
        "mrr@10": round(statistics.fmean(mrr), 4) if mrr else 0.0,
        "queries": len(judged),
        "documents": len(corpus_ids),
        "nodes": space.nodes.count(),
        "space": space.slug,
        "embedding_model": get_embedding_model().model_id,
        "reused_space": reused,
        "ingest_seconds": round(ingest_seconds, 2),
        "query_p50_ms": round(percentile(latencies, 50), 2),
        "query_p95_ms": round(percentile(latencies, 95), 2),
        "rerank_degraded": degraded,
    }


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (0.0 for none)."""
    if not values:
        return 0.0
    rank = max(0, min(len(values) - 1, math.ceil(pct / 100 * len(values)) - 1))
    return values[rank]


# --- regression gate ----------------------------------------------------------------------------
#
# A baseline file records, per database engine and retrieval mode, the metrics a run reached on
# one subject (a BEIR dataset and split, or a space's golden questions) with one top_k, legs and
# fusion. The keyword leg is engine-specific (tantivy BM25 on SQLite, BM25 over english lexemes
# on PostgreSQL), so each engine has numbers of its own:
#
#   {"format": "kfs-eval-baseline/1", "kind": "beir" | "golden",
#    "subject": {"dataset", "split", "top_k", "legs", "fusion"}
#             | {"tenant", "space", "top_k", "tags", "question_set": {"count", "digest"}},
#    "embedding_model": "...", "recorded_at": "2026-11-30T10:00:00Z",
#    "engines": {"sqlite": {"fast": {"ndcg@10": 0.76, "recall@100": 0.97, "mrr@10": 0.71,
#                                    "queries": 30}},
#                "postgresql": {...}}}
#
# The gate compares each measured mode's gated metrics with the baseline's for the engine in
# use: drop = baseline - measured; a drop above ``max_drop`` fails. A mode (or engine) the
# baseline does not hold is not gated and is reported as a note (record it with
# --write-baseline, which adds to the file); a subject that differs fails (the numbers would not
# be comparable).

BASELINE_FORMAT = "kfs-eval-baseline/1"
BEIR_GATE_METRICS = ("ndcg@10", "recall@100", "mrr@10")


def gate_metrics(run: dict) -> tuple[str, ...]:
    """The metrics the gate compares for one run: BEIR ``ndcg@10``, ``recall@100``, ``mrr@10``;
    golden ``hit_rate@k``, ``recall@k``, ``mrr@k`` with the run's ``top_k``."""
    if run.get("kind") == "golden":
        k = run["top_k"]
        return (f"hit_rate@{k}", f"recall@{k}", f"mrr@{k}")
    return BEIR_GATE_METRICS


def _subject(run: dict) -> dict:
    if run.get("kind") == "golden":
        return {
            "tenant": run["tenant"],
            "space": run["space"],
            "top_k": run["top_k"],
            "tags": run["tags"],
            "question_set": run["question_set"],
        }
    return {
        "dataset": run["dataset"],
        "split": run["split"],
        "top_k": run["top_k"],
        "legs": run["legs"],
        "fusion": run["fusion"],
    }


def build_baseline(runs: list[dict], previous: dict | None = None) -> dict:
    """A baseline document from ``runs`` (one per mode, same subject). The modes of
    ``previous`` (a baseline of the same kind and subject) are kept unless measured again."""
    import datetime as dt

    first = runs[0]
    kind = first.get("kind", "beir")
    subject = _subject(first)
    engines: dict[str, dict] = {}
    if previous and previous.get("kind") == kind and previous.get("subject") == subject:
        engines = {e: dict(m) for e, m in previous["engines"].items()}
    modes = engines.setdefault(engine(), {})
    for run in runs:
        modes[run["mode"]] = {
            **{m: run[m] for m in gate_metrics(run)},
            "queries": run["queries"] if "queries" in run else run["questions"],
        }
    return {
        "format": BASELINE_FORMAT,
        "kind": kind,
        "subject": subject,
        "embedding_model": first.get("embedding_model"),
        "recorded_at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()[:-6] + "Z",
        "engines": {e: dict(sorted(m.items())) for e, m in sorted(engines.items())},
    }


def write_baseline(path: Path, runs: list[dict]) -> dict:
    """Write (or extend, see :func:`build_baseline`) the baseline at ``path``; returns it."""
    previous = None
    if path.exists():
        try:
            previous = load_baseline(path)
        except InvalidInput:
            previous = None
    baseline = build_baseline(runs, previous)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(baseline, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # never half-written
    return baseline


def load_baseline(path: Path) -> dict:
    """Read a baseline; 400 ``invalid_baseline`` naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"baseline {path} does not exist", code="invalid_baseline") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"baseline {path} is not JSON: {exc}", code="invalid_baseline") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise InvalidInput(
            f"baseline {path} is not a {BASELINE_FORMAT} document", code="invalid_baseline"
        )
    engines = data.get("engines")
    if not isinstance(engines, dict) or not all(
        isinstance(modes, dict)
        and all(
            isinstance(v, dict)
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v.values())
            for v in modes.values()
        )
        for modes in engines.values()
    ):
        raise InvalidInput(
            f"baseline {path}: 'engines' must map each engine to modes to numeric metrics",
            code="invalid_baseline",
        )
    return data


def engine() -> str:
    """The database engine's name as baselines key it: ``sqlite`` or ``postgresql``."""
    from django.db import connection

    return connection.vendor


def check_gate(runs: list[dict], baseline: dict, max_drop: float) -> dict:
    """Compare ``runs`` (one per mode) with ``baseline``.

    Returns ``{"passed", "max_drop", "checks": [{mode, metric, baseline, measured, drop,
    passed}], "failures": [message], "notes": [message]}``. A failure message names the mode,
    the metric, the baseline, the measured value and the drop, e.g. ``fast ndcg@10 dropped by
    0.0123 (baseline 0.7000, measured 0.6877), more than the allowed 0.0100``. 400
    ``invalid_max_drop`` unless ``0 <= max_drop <= 1``.
    """
    if (
        isinstance(max_drop, bool)
        or not isinstance(max_drop, int | float)
        or not (0 <= max_drop <= 1)
    ):
        raise InvalidInput("max_drop must be a number from 0 to 1", code="invalid_max_drop")
    checks, failures, notes = [], [], []
    for run in runs:
        mode = run["mode"]
        kind = run.get("kind", "beir")
        if baseline.get("kind", "beir") != kind or baseline.get("subject") != _subject(run):
            failures.append(
                f"{mode}: the baseline measures {baseline.get('kind')} "
                f"{json.dumps(baseline.get('subject'), sort_keys=True)}, this run {kind} "
                f"{json.dumps(_subject(run), sort_keys=True)}; not comparable"
            )
            continue
        recorded = baseline["engines"].get(engine(), {}).get(mode)
        if recorded is None:
            notes.append(
                f"{mode}: the baseline holds no {engine()} numbers for it, not gated "
                "(record them with --write-baseline)"
            )
            continue
        for metric in gate_metrics(run):
            if metric not in recorded:
                notes.append(f"{mode} {metric}: not in the baseline, not gated")
                continue
            drop = round(recorded[metric] - run[metric], 4)
            ok = drop <= max_drop + 1e-9
            checks.append(
                {
                    "mode": mode,
                    "metric": metric,
                    "baseline": recorded[metric],
                    "measured": run[metric],
                    "drop": drop,
                    "passed": ok,
                }
            )
            if not ok:
                failures.append(
                    f"{mode} {metric} dropped by {drop:.4f} (baseline {recorded[metric]:.4f}, "
                    f"measured {run[metric]:.4f}), more than the allowed {max_drop:.4f}"
                )
    model = runs[0].get("embedding_model") if runs else None
    if baseline.get("embedding_model") and model and baseline["embedding_model"] != model:
        notes.append(
            f"the baseline was recorded with {baseline['embedding_model']}, this run uses {model}"
        )
    return {
        "passed": not failures,
        "max_drop": max_drop,
        "checks": checks,
        "failures": failures,
        "notes": notes,
    }
