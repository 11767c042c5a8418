"""Scale curve ``prepare``: export the SciFact evaluation space read-only into
``STATE/source.pkl``, embed the test claims once (``STATE/queries.npz``) and per size the exact
top-50 of every query in numpy (``STATE/truth-<size>.npz``, the recall ground truth)."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from pathlib import Path

import numpy as np

from .state import (
    DEPTH,
    EVAL_TENANT,
    copy_ids,
    copy_vectors,
    layout,
    load_source,
    log,
    parse_sizes,
    state_dir,
)


# --- prepare ------------------------------------------------------------------------------------
def export_source(source_var: Path) -> dict:
    """The evaluation space's visible documents, nodes and vectors (read-only SQL)."""
    uri = f"file:{source_var / 'knowledgefs.sqlite3'}?mode=ro"
    db = sqlite3.connect(uri, uri=True)
    space_id, model_id, number, dimension = db.execute(
        "SELECT s.id, v.model_id, v.number, v.dimension FROM spaces_knowledgespace s "
        "JOIN retrieval_indexversion v ON v.space_id = s.id AND v.state = 'active' "
        "WHERE s.tenant_id = ? AND s.slug LIKE 'eval-scifact-%'",
        [EVAL_TENANT],
    ).fetchone()
    docs = {}
    for row in db.execute(
        "SELECT id, filename, mime_type, size_bytes, sha256, storage_key, metadata "
        "FROM ingestion_document WHERE space_id = ? AND state = 'published' AND enabled "
        "ORDER BY id",
        [space_id],
    ):
        docs[row[0]] = {
            "id": row[0], "filename": row[1], "mime_type": row[2], "size_bytes": row[3],
            "sha256": row[4], "storage_key": row[5], "metadata": json.loads(row[6]), "nodes": [],
        }  # fmt: skip
    vectors = []
    for row in db.execute(
        "SELECT n.document_id, n.chunk_index, n.kind, n.text, n.start_offset, n.end_offset, "
        "n.page_number, n.section_path, v.vector FROM ingestion_knowledgenode n "
        "JOIN ingestion_document d ON d.id = n.document_id AND d.active_generation = n.generation "
        "JOIN retrieval_densevector v ON v.node_id = n.id AND v.index_version = ? "
        "WHERE n.space_id = ? ORDER BY n.document_id, n.chunk_index",
        [number, space_id],
    ):
        if row[0] not in docs:
            continue
        docs[row[0]]["nodes"].append(
            {
                "chunk_index": row[1], "kind": row[2], "text": row[3], "start_offset": row[4],
                "end_offset": row[5], "page_number": row[6], "section_path": json.loads(row[7]),
            }
        )  # fmt: skip
        vectors.append(np.frombuffer(row[8], dtype="<f4"))
    documents = [d for d in docs.values() if d["nodes"]]
    matrix = np.vstack(vectors).astype(np.float32)
    assert matrix.shape[1] == dimension
    return {"model_id": model_id, "dimension": dimension, "documents": documents, "vectors": matrix}


def embed_claims(dataset: Path, count: int, model_id: str) -> tuple[list[str], np.ndarray]:
    """The first ``count`` SciFact test claims (with qrels) and their query vectors."""
    import django

    django.setup()
    from knowledgefs.runtime import get_embedding_model
    from retrieval.evaluation import load_dataset

    _, _, queries, qrels = load_dataset(dataset, "test")
    texts = [queries[q] for q in qrels if q in queries][:count]
    model = get_embedding_model(model_id)
    vectors = np.asarray([model.embed_query(t) for t in texts], dtype=np.float32)
    return texts, vectors


def exact_truth(source: dict, size: int, queries: np.ndarray, depth: int = DEPTH) -> dict:
    """Exact top-``depth`` node ids and cosines per query over the generated vectors of
    ``size`` (numpy, float32 dot products of unit vectors), in the order of :func:`layout`."""
    plan = layout(source, size)
    offsets = np.cumsum([0] + [len(d["nodes"]) for d in source["documents"]])
    best_scores = np.full((len(queries), 0), -2.0, dtype=np.float32)
    best_rows = np.zeros((len(queries), 0), dtype=np.int64)
    ids: list[str] = []
    by_copy: dict[int, list[int]] = {}
    for copy, index in plan:
        by_copy.setdefault(copy, []).append(index)
    for copy, indexes in by_copy.items():
        vectors = copy_vectors(source, copy)
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indexes])
        first = len(ids)
        ids.extend(n.hex for i in indexes for n in copy_ids(source, copy, i)[2])
        scores = queries @ vectors[rows].T  # (queries, rows of this copy)
        merged = np.concatenate([best_scores, scores], axis=1)
        merged_rows = np.concatenate(
            [best_rows, np.broadcast_to(np.arange(first, len(ids)), scores.shape)], axis=1
        )
        top = np.argsort(-merged, axis=1, kind="stable")[:, :depth]
        best_scores = np.take_along_axis(merged, top, axis=1)
        best_rows = np.take_along_axis(merged_rows, top, axis=1)
    best_ids = [[ids[r] for r in row] for row in best_rows]
    return {"chunks": len(ids), "ids": best_ids, "scores": best_scores}


def cmd_prepare(args) -> int:
    import django

    out = state_dir()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KNOWLEDGE_VAR_DIR", str(out / "prepare-var"))
    Path(os.environ["KNOWLEDGE_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
    django.setup()  # the truth's node ids come from the compiler's namespace (ingestion)
    if not (out / "source.pkl").exists():
        log(f"exporting the evaluation space from {args.source_var}")
        source = export_source(Path(args.source_var))
        with (out / "source.pkl").open("wb") as handle:
            pickle.dump(source, handle, protocol=pickle.HIGHEST_PROTOCOL)
    source = load_source()
    log(f"source: {len(source['documents'])} documents, {len(source['vectors'])} chunks")
    if not (out / "queries.npz").exists():
        texts, vectors = embed_claims(Path(args.dataset), args.claims, source["model_id"])
        np.savez(out / "queries.npz", vectors=vectors, texts=np.array(texts, dtype=object))
        log(f"embedded {len(texts)} claims")
    queries = np.load(out / "queries.npz", allow_pickle=True)["vectors"]
    for size in parse_sizes(args.sizes):
        path = out / f"truth-{size}.npz"
        if path.exists():
            continue
        t0 = time.perf_counter()
        truth = exact_truth(source, size, queries)
        np.savez(path, ids=np.array(truth["ids"]), scores=truth["scores"], chunks=truth["chunks"])
        log(f"truth {size}: {truth['chunks']} chunks, {time.perf_counter() - t0:.1f} s")
    return 0
