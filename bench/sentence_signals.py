"""Do sentence-level signals lift the embedded default's ranking on SciFact? Train fit, test once.

SciFact's claims are supported or refuted by one or two rationale sentences of an abstract, so a
signal read at the sentence level might rank better than one read over the whole abstract. This
measures three such signals, and one tuning, over offline whole-document legs (one node per
SciFact record, ``title + " " + text``; the product's keyword analysis and tantivy BM25 in memory,
exact cosine over bge-small-en-v1.5 int8, the product's default model):

1. ``maxsent``: the best cosine between the query and one sentence of the document (the
   abstract's sentences by :func:`retrieval.sentences.split_sentences`, and the title, each
   embedded alone), as a third feature of the calibrated combination
   ``f = α · cos + β · maxsent + (1 − α − β) · log1p(bm25) / KEYWORD_REFERENCE``;
2. ``title``: the cosine of the document's title alone, in the place of ``maxsent``;
3. ``sentence rerank``: the local cross-encoder (:mod:`knowledgefs.runtime.local_rerank`) on the
   query and each of the :data:`TOP_K` sentences of a candidate closest to it by the bi-encoder,
   for the first :data:`TOP_N` candidates of the calibrated first stage (``α`` 0.8);
   ``final = f + w · σ(max logit / T) + w₂ · maxsent``;
4. ``query adapter``: a linear map of the query vector fitted on the train judgments
   (:func:`query_adapter`), the test claims split by whether their abstracts are judged in train.

Every weight is chosen by a grid over train nDCG@10 (809 claims) and reported once on test (300).
Caches under ``var/bench/sentences/``: the 5,183 documents and 49,976 sentences are embedded once
(about 5 min each on 2 cores), the cross-encoder scores 66,420 short pairs once (about 15 min).

Usage: ``nice .venv/bin/python bench/sentence_signals.py [--dataset DIR] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
CACHE = ROOT / "var" / "bench" / "sentences"
TOP_N, TOP_K = 20, 3  # candidates reranked; sentences of each scored by the cross-encoder
ALPHA = 0.8  # the calibrated fusion's dense share (retrieval.calibration.CALIBRATIONS)


@dataclass
class Row:
    """One judged query's candidates (the union of each leg's top 100) and their features."""

    query: str
    docs: list[int]  # corpus indices
    cos: np.ndarray
    kw: np.ndarray
    maxsent: np.ndarray
    title: np.ndarray
    vector: np.ndarray
    relevant: dict[str, int]

    def first_stage(self, cos: np.ndarray | None = None) -> np.ndarray:
        """The calibrated first stage's ranking feature (over ``cos`` in place of the row's)."""
        return ALPHA * (self.cos if cos is None else cos) + (1 - ALPHA) * self.kw


def cached_vectors(name: str, texts: list[str], model) -> np.ndarray:
    path = CACHE / f"{name}.npy"
    if path.exists():
        return np.load(path)
    t0 = time.perf_counter()
    parts = [model.embed_documents(texts[i : i + 2048]) for i in range(0, len(texts), 2048)]
    vectors = np.concatenate(parts)
    np.save(path, vectors)
    print(f"embedded {len(texts)} {name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return vectors


class Corpus:
    """The SciFact corpus, its sentences and their vectors, and the keyword leg."""

    def __init__(self, dataset: Path) -> None:
        from calibrate_fusion import BgeSmall, keyword_search

        from retrieval.sentences import split_sentences

        CACHE.mkdir(parents=True, exist_ok=True)
        records = [json.loads(line) for line in gzip.open(dataset / "corpus.jsonl.gz", "rt")]
        self.ids = [str(r["_id"]) for r in records]
        texts = [f"{r.get('title', '')} {r.get('text', '')}".strip() for r in records]
        self.sentences: list[str] = []
        owner, self.title_row = [], []
        self.rows_of: list[list[int]] = []
        for i, record in enumerate(records):
            first = len(self.sentences)
            self.sentences.extend(split_sentences(record.get("text", "")))
            self.title_row.append(len(self.sentences))
            self.sentences.append(record.get("title", ""))
            owner.extend([i] * (len(self.sentences) - first))
            self.rows_of.append(list(range(first, len(self.sentences))))
        self.owner = np.array(owner)
        self.model = BgeSmall()
        self.docs = cached_vectors("docs", texts, self.model)
        self.vectors = cached_vectors("sentences", self.sentences, self.model)
        self.search = keyword_search(texts)

    def rows(self, queries: dict, qrels: dict) -> list[Row]:
        from retrieval.calibration import KEYWORD_REFERENCE

        judged = [q for q in qrels if q in queries]
        out = []
        vectors = self.model.embed_queries([queries[q] for q in judged])
        for q, vector in zip(judged, vectors, strict=True):
            cos = self.docs @ vector
            per_sentence = self.vectors @ vector
            maxsent = np.full(len(self.ids), -1.0, dtype=np.float32)
            np.maximum.at(maxsent, self.owner, per_sentence)
            keyword = dict(self.search(queries[q]))
            k_miss = min(keyword.values()) if len(keyword) >= 100 else 0.0
            tops = (np.argsort(-cos)[:100], np.argsort(-maxsent)[:100])
            docs = sorted({*tops[0].tolist(), *keyword, *tops[1].tolist()})
            kw = np.array([math.log1p(max(keyword.get(i, k_miss), 0.0)) for i in docs])
            out.append(
                Row(
                    query=queries[q],
                    docs=docs,
                    cos=cos[docs],
                    kw=kw / KEYWORD_REFERENCE,
                    maxsent=maxsent[docs],
                    title=per_sentence[[self.title_row[i] for i in docs]],
                    vector=vector,
                    relevant=qrels[q],
                )
            )
        return out


def ndcg(corpus: Corpus, rows: list[Row], score) -> float:
    """Mean nDCG@10 of the orders ``score(row) -> per-candidate array`` (higher first)."""
    from retrieval.evaluation import ndcg_at_k

    values = []
    for row in rows:
        order = np.argsort(-score(row), kind="stable")
        values.append(ndcg_at_k([corpus.ids[row.docs[i]] for i in order], row.relevant, 10))
    return round(float(np.mean(values)), 4)


def third_feature(corpus: Corpus, rows: dict, name: str) -> dict:
    """``α``, ``β`` of ``f = α·cos + β·<name> + (1−α−β)·kw`` by a train grid; test once."""

    def combo(a, b):
        return lambda r: a * r.cos + b * getattr(r, name) + (1 - a - b) * r.kw

    grid = [
        (ndcg(corpus, rows["train"], combo(a, b)), round(a, 1), round(b, 1))
        for a in np.arange(0, 1.01, 0.1)
        for b in np.arange(0, 1.01 - a, 0.1)
    ]
    train, a, b = max(grid)
    return {"alpha": a, "beta": b, "train": train, "test": ndcg(corpus, rows["test"], combo(a, b))}


def sentence_logits(corpus: Corpus, rows: list[Row], split: str) -> dict[str, list[float]]:
    """Per query, per first-stage candidate of the top :data:`TOP_N`: the cross-encoder's best
    logit over the candidate's :data:`TOP_K` sentences closest to the query (cached)."""
    from knowledgefs.runtime.local_rerank import get_local_reranker

    path = CACHE / f"sentence-logits-{split}.pkl"
    cache = pickle.loads(path.read_bytes()) if path.exists() else {}
    out = {}
    for row in rows:
        best = []
        for j in np.argsort(-row.first_stage(), kind="stable")[:TOP_N]:
            key = (row.query, row.docs[j])
            if key not in cache:
                own = corpus.rows_of[row.docs[j]]
                near = np.argsort(-(corpus.vectors[own] @ row.vector))[:TOP_K]
                passages = [corpus.sentences[own[k]] for k in near]
                logits = get_local_reranker().score(
                    row.query, passages, deadline=time.monotonic() + 60
                )
                cache[key] = float(np.max(logits))
            best.append(cache[key])
        out[row.query] = best
    path.write_bytes(pickle.dumps(cache))
    return out


def sentence_rerank(corpus: Corpus, rows: dict) -> dict:
    """``(w, T, w₂)`` of the sentence rerank by a train grid; test once."""
    logits = {split: sentence_logits(corpus, rows[split], split) for split in rows}

    def reranked(split, w, t, w2):
        def score(row):
            first = row.first_stage()
            head = np.argsort(-first, kind="stable")[:TOP_N]
            final = first - 10.0  # below every reranked candidate, in first-stage order
            for j, logit in zip(head, logits[split][row.query], strict=True):
                final[j] = first[j] + w * (1 / (1 + math.exp(-logit / t))) + w2 * row.maxsent[j]
            return final

        return ndcg(corpus, rows[split], score)

    grid = [
        (reranked("train", w, t, w2), w, t, w2)
        for w in (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
        for t in (2.0, 4.0, 8.0)
        for w2 in (0.0, 0.1, 0.2, 0.3, 0.5)
    ]
    train, w, t, w2 = max(grid)
    alone = max(g for g in grid if g[3] == 0.0)
    return {
        "top_n": TOP_N,
        "top_k_sentences": TOP_K,
        "w": w,
        "temperature": t,
        "w_maxsent": w2,
        "train": train,
        "test": reranked("test", w, t, w2),
        "cross_encoder_alone_in_mix": {
            "w": alone[1],
            "temperature": alone[2],
            "train": alone[0],
            "test": reranked("test", alone[1], alone[2], 0.0),
        },
    }


def query_adapter(corpus: Corpus, rows: dict, train_qrels: dict) -> dict:
    """A linear map of the query vector fitted on the train claims (ridge toward the identity:
    ``W = (QᵀQ + λI)⁻¹ (QᵀR + λI)``, ``R`` the mean vector of each claim's relevant abstracts),
    in the first stage; test split by whether a claim's relevant abstract is also relevant to a
    train claim (SciFact reuses abstracts across splits, so the map can learn them)."""
    index = {doc: i for i, doc in enumerate(corpus.ids)}
    train_docs = {d for judged in train_qrels.values() for d, r in judged.items() if r > 0}
    q = np.stack([r.vector for r in rows["train"]])
    targets = np.stack(
        [
            np.mean([corpus.docs[index[d]] for d, rel in r.relevant.items() if rel > 0], axis=0)
            for r in rows["train"]
        ]
    )

    def adapted(w):
        def score(row):
            v = row.vector @ w
            return row.first_stage(corpus.docs[row.docs] @ (v / np.linalg.norm(v)))

        return score

    shared, unshared = [], []
    for row in rows["test"]:
        judged = {d for d, v in row.relevant.items() if v > 0}
        (shared if judged & train_docs else unshared).append(row)
    out = {"test_claims_sharing_a_train_abstract": len(shared), "others": len(unshared)}
    for lam in (None, 100.0, 30.0, 10.0, 3.0):
        if lam is None:
            w = np.eye(q.shape[1])
        else:
            w = np.linalg.solve(
                q.T @ q + lam * np.eye(q.shape[1]), q.T @ targets + lam * np.eye(q.shape[1])
            )
        out["none" if lam is None else f"lambda {lam:g}"] = {
            "train": ndcg(corpus, rows["train"], adapted(w)),
            "test": ndcg(corpus, rows["test"], adapted(w)),
            "test_sharing": ndcg(corpus, shared, adapted(w)),
            "test_others": ndcg(corpus, unshared, adapted(w)),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/data/scifact")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import django

    django.setup()
    from retrieval.evaluation import load_dataset

    corpus = Corpus(args.dataset)
    rows, qrels_of = {}, {}
    for split in ("train", "test"):
        _, _, queries, qrels_of[split] = load_dataset(args.dataset, split)
        rows[split] = corpus.rows(queries, qrels_of[split])

    def alone(name):
        return {split: ndcg(corpus, rows[split], lambda r: getattr(r, name)) for split in rows}

    report = {
        "dataset": args.dataset.name,
        "queries": {split: len(rows[split]) for split in rows},
        "sentences": len(corpus.sentences),
        "alone": {name: alone(name) for name in ("cos", "kw", "maxsent", "title")},
        "first_stage_calibrated": {
            split: ndcg(corpus, rows[split], Row.first_stage) for split in rows
        },
        "with_maxsent": third_feature(corpus, rows, "maxsent"),
        "with_title": third_feature(corpus, rows, "title"),
        "sentence_rerank": sentence_rerank(corpus, rows),
        "query_adapter": query_adapter(corpus, rows, qrels_of["train"]),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
