"""One size of bench/floor.py, run inside ``var/bench-floor-venv``: the exact floor (bm25s
keyword top 50 + numpy float32 matrix-vector product and ``argpartition`` dense top 50, min-max
fusion, top 10) and the HNSW floor (the same with FAISS ``IndexHNSWFlat``, M 16,
efConstruction 64, the smallest efSearch of a sweep whose dense recall@10 against exact is
≥ the target). Per-query latency includes the query's tokenization and excludes its embedding
(the precomputed vectors of ``STATE/queries.npz``). Prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import bm25s
import faiss
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenizer

from floorpeers.corpus import (
    DEPTH,
    TOP_K,
    build_corpus,
    load_queries,
    min_max_fuse,
    percentiles,
    wait_for_quiet,
)

EF_SWEEP = (50, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's bm25() defaults, which the product's keyword leg uses


def log(message: str) -> None:
    print(f"[floor load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)


class KeywordLeg:
    """bm25s (method ``lucene``, English stop words, Snowball English stemmer via PyStemmer)."""

    def __init__(self, texts: list[str]):
        self.tokenizer = Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english").stemWord)
        tokens = self.tokenizer.tokenize(texts, return_as="tuple", show_progress=False)
        self.retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
        self.retriever.index(tokens, show_progress=False)

    def search(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        ids = self.tokenizer.tokenize(
            [text], update_vocab=False, return_as="ids", show_progress=False
        )
        rows, scores = self.retriever.retrieve(ids, k=DEPTH, show_progress=False, n_threads=0)
        rows, scores = rows[0], scores[0]
        keep = scores > 0  # only rows matching a query term, as an FTS MATCH returns
        return rows[keep], scores[keep]


def exact_dense(matrix: np.ndarray, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top ``DEPTH`` rows by inner product (unit vectors: cosine), best first."""
    scores = matrix @ vector
    top = np.argpartition(-scores, DEPTH)[:DEPTH]
    order = top[np.argsort(-scores[top], kind="stable")]
    return order, scores[order]


def hnsw_dense(index, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, rows = index.search(vector.reshape(1, -1), DEPTH)
    keep = rows[0] >= 0
    return rows[0][keep], scores[0][keep]


def timed_rounds(keyword, dense, texts, vectors, rounds, warmup, quiet) -> dict:
    """``rounds`` passes over the queries (after ``warmup`` untimed ones), each gated on the
    load average; per-query total and per-leg ms, percentiles per round and their medians."""
    for text, vector in zip(texts[:warmup], vectors[:warmup], strict=True):
        min_max_fuse([keyword(text), dense(vector)])
    per_round, gates, tops = [], [], []
    for _ in range(rounds):
        gates.append(wait_for_quiet(*quiet))
        total, cpu, kw_ms, dense_ms, fuse_ms, tops = [], [], [], [], [], []
        for text, vector in zip(texts, vectors, strict=True):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            kw = keyword(text)
            t1 = time.perf_counter()
            dn = dense(vector)
            t2 = time.perf_counter()
            tops.append(min_max_fuse([kw, dn]))
            t3 = time.perf_counter()
            cpu.append((time.thread_time() - c0) * 1000)
            total.append((t3 - t0) * 1000)
            kw_ms.append((t1 - t0) * 1000)
            dense_ms.append((t2 - t1) * 1000)
            fuse_ms.append((t3 - t2) * 1000)
        per_round.append(
            {
                **percentiles(total),
                # This thread's CPU time per query (time.thread_time): what the query costs
                # when the shared machine preempts it (bench/fast_cost.py reports the same).
                "cpu": percentiles(cpu),
                "keyword": percentiles(kw_ms),
                "dense": percentiles(dense_ms),
                "fusion": percentiles(fuse_ms),
                "load_avg_end": [round(v, 2) for v in os.getloadavg()],
            }
        )
    return {
        "p50_ms": round(float(np.median([r["p50_ms"] for r in per_round])), 2),
        "p95_ms": round(float(np.median([r["p95_ms"] for r in per_round])), 2),
        "cpu_p50_ms": round(float(np.median([r["cpu"]["p50_ms"] for r in per_round])), 2),
        "cpu_p95_ms": round(float(np.median([r["cpu"]["p95_ms"] for r in per_round])), 2),
        "rounds": per_round,
        "gates": gates,
        "top10": tops,
    }


def recall_at(found: list, truth: list, k: int) -> float:
    """Mean over queries of ``|found[:k] ∩ truth[:k]| / k``."""
    hits = [len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]
    return round(float(np.mean(hits)), 4)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--max-load", type=float, default=3.0)
    parser.add_argument("--max-wait", type=float, default=600)
    parser.add_argument("--recall-target", type=float, default=0.99)
    parser.add_argument("--build-threads", type=int, default=2)
    args = parser.parse_args()
    quiet = (args.max_load, args.max_wait)
    texts, vectors = load_queries()
    texts, vectors = texts[: args.queries], vectors[: args.queries]
    corpus = build_corpus(args.size)
    matrix = corpus["vectors"]
    log(f"{args.size}: {len(matrix)} chunks, {corpus['copies']} copies, {corpus['corpus_s']} s")
    out: dict = {
        "size": args.size,
        "chunks": len(matrix),
        "documents": corpus["documents"],
        "copies": corpus["copies"],
        "vectors_sha256": corpus["vectors_sha256"],
        "queries": len(texts),
        "corpus_generation_s": corpus["corpus_s"],
        "bm25": {"k1": BM25_K1, "b": BM25_B, "method": "lucene", "stemmer": "snowball english"},
    }
    gate = wait_for_quiet(*quiet)
    t0 = time.perf_counter()
    keyword = KeywordLeg(corpus["texts"])
    out["keyword_build"] = {"s": round(time.perf_counter() - t0, 2), **gate}
    out["keyword_vocabulary"] = len(keyword.retriever.vocab_dict)
    del corpus["texts"]
    log(f"{args.size}: bm25s index in {out['keyword_build']['s']} s")

    exact = timed_rounds(
        keyword.search, lambda v: exact_dense(matrix, v), texts, vectors, args.rounds,
        args.warmup, quiet,
    )  # fmt: skip
    exact_tops = exact.pop("top10")
    out["exact"] = exact
    log(f"{args.size}: exact p50 {exact['p50_ms']} p95 {exact['p95_ms']} ms")

    faiss.omp_set_num_threads(args.build_threads)
    gate = wait_for_quiet(*quiet)
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(matrix.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.add(matrix)
    out["hnsw_build"] = {"s": round(time.perf_counter() - t0, 2), "threads": args.build_threads}
    out["hnsw_build"].update(gate)
    log(f"{args.size}: HNSW built in {out['hnsw_build']['s']} s")
    faiss.omp_set_num_threads(1)  # one query at a time, as a request handler runs it
    truth = [exact_dense(matrix, v)[0] for v in vectors]
    sweep, chosen = [], None
    for ef in EF_SWEEP:
        index.hnsw.efSearch = ef
        found = [hnsw_dense(index, v)[0] for v in vectors]
        point = {"ef_search": ef, "recall@10": recall_at(found, truth, TOP_K)}
        point["recall@50"] = recall_at(found, truth, DEPTH)
        sweep.append(point)
        if chosen is None and point["recall@10"] >= args.recall_target:
            chosen = ef
            break
    chosen = chosen or EF_SWEEP[-1]
    index.hnsw.efSearch = chosen
    hnsw = timed_rounds(
        keyword.search, lambda v: hnsw_dense(index, v), texts, vectors, args.rounds,
        args.warmup, quiet,
    )  # fmt: skip
    hnsw_tops = hnsw.pop("top10")
    hnsw["ef_search"] = chosen
    hnsw["sweep"] = sweep
    hnsw["dense_recall@10"] = next(p["recall@10"] for p in sweep if p["ef_search"] == chosen)
    hnsw["fused_top10_agreement"] = recall_at(hnsw_tops, exact_tops, TOP_K)
    out["hnsw"] = hnsw
    log(f"{args.size}: HNSW ef {chosen} p50 {hnsw['p50_ms']} p95 {hnsw['p95_ms']} ms")
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["threads"] = {
        "faiss_query": 1,
        "faiss_build": args.build_threads,
        "blas_env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
