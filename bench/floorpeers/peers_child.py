"""One framework at one size of bench/peers.py, run inside ``var/bench-peers-venv``: builds a
hybrid retriever over the scale-curve texts and precomputed vectors (no embedding model: every
node and every query carries its vector) and times a top-10 query with 50 candidates per leg.

LlamaIndex: ``TextNode(embedding=...)`` in a ``VectorStoreIndex`` (``SimpleVectorStore``) and
a ``BM25Retriever`` (bm25s, English stemmer), fused by ``QueryFusionRetriever`` in
``relative_score`` mode (min-max per retriever, equal weights: the product's fusion), one
query, no LLM. Haystack: an ``InMemoryDocumentStore`` (BM25Okapi, dot product, embeddings not
returned) with ``InMemoryBM25Retriever`` and ``InMemoryEmbeddingRetriever`` into a
``DocumentJoiner`` (``distribution_based_rank_fusion``, its score-normalising mode, top 10) in a
``Pipeline``. The parent sets ``HAYSTACK_TELEMETRY_ENABLED=False``. Prints one JSON object on
stdout."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from floorpeers.corpus import (
    DEPTH,
    TOP_K,
    build_corpus,
    load_queries,
    percentiles,
    wait_for_quiet,
)


def log(message: str) -> None:
    print(f"[peers load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)


def build_llamaindex(texts, vectors, keys):
    """Returns ``(query(text, vector) -> keys, dense(vector) -> keys)``."""
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.schema import QueryBundle, TextNode
    from llama_index.retrievers.bm25 import BM25Retriever

    class NoEmbedding(MockEmbedding):
        """Fails if the framework ever tries to embed: every vector is given."""

        def _get_query_embedding(self, query):
            raise RuntimeError("query embedding requested")

        def _get_text_embedding(self, text):
            raise RuntimeError("text embedding requested")

    Settings.embed_model = NoEmbedding(embed_dim=vectors.shape[1])
    Settings.llm = MockLLM()
    nodes = [
        TextNode(text=text, id_=key, embedding=vector.tolist())
        for text, key, vector in zip(texts, keys, vectors, strict=True)
    ]
    index = VectorStoreIndex(nodes)
    vector_retriever = index.as_retriever(similarity_top_k=DEPTH)
    bm25 = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=DEPTH, language="english")
    fusion = QueryFusionRetriever(
        [vector_retriever, bm25], mode="relative_score", similarity_top_k=TOP_K, num_queries=1,
        use_async=False, llm=MockLLM(),
    )  # fmt: skip

    def query(text, vector):
        hits = fusion.retrieve(QueryBundle(query_str=text, embedding=vector.tolist()))
        return [h.node.node_id for h in hits]

    def dense(vector):
        hits = vector_retriever.retrieve(QueryBundle(query_str="", embedding=vector.tolist()))
        return [h.node.node_id for h in hits]

    return query, dense


def build_haystack(texts, vectors, keys):
    from haystack import Document, Pipeline
    from haystack.components.joiners import DocumentJoiner
    from haystack.components.retrievers.in_memory import (
        InMemoryBM25Retriever,
        InMemoryEmbeddingRetriever,
    )
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    store = InMemoryDocumentStore(
        bm25_algorithm="BM25Okapi", embedding_similarity_function="dot_product",
        return_embedding=False,
    )  # fmt: skip
    store.write_documents(
        [
            Document(id=key, content=text, embedding=vector.tolist())
            for text, key, vector in zip(texts, keys, vectors, strict=True)
        ]
    )
    pipeline = Pipeline()
    pipeline.add_component("bm25", InMemoryBM25Retriever(store, top_k=DEPTH))
    pipeline.add_component("dense", InMemoryEmbeddingRetriever(store, top_k=DEPTH))
    pipeline.add_component(
        "join", DocumentJoiner(join_mode="distribution_based_rank_fusion", top_k=TOP_K)
    )
    pipeline.connect("bm25.documents", "join.documents")
    pipeline.connect("dense.documents", "join.documents")
    embedding = InMemoryEmbeddingRetriever(store, top_k=DEPTH)

    def query(text, vector):
        out = pipeline.run({"bm25": {"query": text}, "dense": {"query_embedding": vector.tolist()}})
        return [d.id for d in out["join"]["documents"]]

    def dense(vector):
        return [d.id for d in embedding.run(query_embedding=vector.tolist())["documents"]]

    return query, dense


BUILDERS = {"llamaindex": build_llamaindex, "haystack": build_haystack}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=sorted(BUILDERS), required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-load", type=float, default=3.0)
    parser.add_argument("--max-wait", type=float, default=600)
    parser.add_argument("--max-seconds", type=float, default=1800, help="per timed round")
    args = parser.parse_args()
    quiet = (args.max_load, args.max_wait)
    texts, vectors = load_queries()
    texts, vectors = texts[: args.queries], vectors[: args.queries]
    corpus = build_corpus(args.size)
    matrix = corpus["vectors"]
    out: dict = {
        "framework": args.framework,
        "size": args.size,
        "chunks": len(matrix),
        "vectors_sha256": corpus["vectors_sha256"],
    }
    gate = wait_for_quiet(*quiet)
    t0 = time.perf_counter()
    query, dense = BUILDERS[args.framework](corpus["texts"], matrix, corpus["keys"])
    out["build"] = {"s": round(time.perf_counter() - t0, 2), **gate}
    log(f"{args.framework} {args.size}: built in {out['build']['s']} s")
    # the vectors reached the framework as given: its dense top 10 against numpy's
    check = min(10, len(vectors))
    agree = []
    for vector in vectors[:check]:
        exact = np.argsort(-(matrix @ vector), kind="stable")[:TOP_K]
        agree.append(len(set(dense(vector)[:TOP_K]) & {corpus["keys"][r] for r in exact}) / TOP_K)
    out["dense_top10_vs_numpy"] = round(float(np.mean(agree)), 4)
    del matrix, corpus
    for text, vector in zip(texts[: args.warmup], vectors[: args.warmup], strict=True):
        query(text, vector)
    rounds = []
    for _ in range(args.rounds):
        gate = wait_for_quiet(*quiet)
        times, counts, deadline = [], [], time.monotonic() + args.max_seconds
        for text, vector in zip(texts, vectors, strict=True):
            if time.monotonic() > deadline:
                break
            t0 = time.perf_counter()
            found = query(text, vector)
            times.append((time.perf_counter() - t0) * 1000)
            counts.append(len(found))
        rounds.append(
            {**percentiles(times), "queries": len(times), **gate,
             "load_avg_end": [round(v, 2) for v in os.getloadavg()]}
        )  # fmt: skip
        log(f"{args.framework} {args.size}: {rounds[-1]}")
    out["rounds"] = rounds
    # LlamaIndex's fusion merges hits by content hash, so identical texts of different copies
    # count once and a query can return fewer than 10 nodes: recorded, not an error
    out["hits_returned"] = {"min": min(counts), "mean": round(float(np.mean(counts)), 2)}
    if min(counts) < 1:
        raise SystemExit("a query returned no hits")
    out["p50_ms"] = round(float(np.median([r["p50_ms"] for r in rounds])), 2)
    out["p95_ms"] = round(float(np.median([r["p95_ms"] for r in rounds])), 2)
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
