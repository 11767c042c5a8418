"""The SQLite dense leg across publications: cold build, steady latency and the first query after
each publish, on a generated space of random unit vectors with real document and node rows.

    python bench/dense_refresh.py generate --var /tmp/dense-100k --size 100000
    python bench/dense_refresh.py measure --var /tmp/dense-100k --queries 300 --publishes 10

``generate`` migrates a fresh SQLite database under ``--var`` (``KNOWLEDGE_VAR_DIR``), creates a
space with index version 1 (``--dim`` dimensions, default 384 like the local model) and inserts
``--size`` chunks as documents of ``--chunks`` nodes each (rows by one ``executemany`` per table,
:func:`scale.generate.fast_insert`; seeded Gaussian vectors normalised to unit length). No keyword
rows: only the dense leg is measured.

``measure`` runs in one process, through ``get_search_backend().dense_search`` (the Fast leg's
depth of 50): the cold build (the first query), ``--queries`` steady queries (p50/p95), then
``--publishes`` times: one more document of ``--chunks`` nodes written with its vectors first and
published by moving the head (what a compilation's publish does in the database), and the first
query after it timed. It prints one JSON object; ``--copy`` measures on a copy of the database so
runs start from the same rows. ``bridge-ids`` times the Dify bridge's authorized ids (CPU, the
old and the new way, and checks they are equal). ``ab --baseline OLD/retrieval/backends/base.py``
runs an older dense leg and this one side by side in one process (the fairest latency comparison
on a shared machine). The backend's ``dense_stats()`` (when it has
one) reports rows read by the last refresh and bytes per matrix row. Query embedding is not part
of any figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

TENANT = "kfs-bench"
SLUG = "dense-refresh"
MODEL_ID = "bench/random-unit"
DEPTH = 50  # Fast's dense leg at top_k 10 (retrieval.planner)
SEED = 20261201


def setup(var: Path) -> None:
    os.environ["KNOWLEDGE_VAR_DIR"] = str(var)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


WORDS = [f"w{i}" for i in range(2000)]


def write_documents(space, version, count: int, chunks: int, rng, *, tag: str, keywords=False):
    """Insert ``count`` published documents of ``chunks`` nodes with their vectors (and their
    keyword rows when ``keywords``: 30 words drawn from :data:`WORDS`), in one transaction;
    returns the nodes written."""
    from django.db import connection, transaction
    from django.utils import timezone
    from scale.generate import fast_insert

    from ingestion.models import Document, KnowledgeNode
    from retrieval.models import DenseVector

    now = timezone.now()
    docs, nodes, vectors = [], [], []
    matrix = unit(rng, count * chunks, version.dimension).astype("<f4")
    for d in range(count):
        document_id, generation = uuid.uuid4(), uuid.uuid4()
        docs.append(
            {"id": document_id, "tenant_id": space.tenant_id, "space_id": space.id,
             "filename": f"{tag}-{d}.md", "mime_type": "text/markdown", "size_bytes": 100,
             "sha256": uuid.uuid4().hex * 2, "storage_key": f"{tag}/{document_id}",
             "state": "published", "active_generation": generation, "node_count": chunks}
        )  # fmt: skip
        for c in range(chunks):
            node_id = uuid.uuid4()
            nodes.append(
                {"id": node_id, "space_id": space.id, "document_id": document_id,
                 "generation": generation, "chunk_index": c,
                 "text": " ".join(rng.choice(WORDS, 30)) if keywords else f"chunk {c} {tag} {d}",
                 "start_offset": c * 10, "end_offset": c * 10 + 9, "section_path": []}
            )  # fmt: skip
            vectors.append(
                {"node_id": node_id, "space_id": space.id, "index_version": version.number,
                 "model_id": version.model_id, "dimension": version.dimension,
                 "vector": matrix[len(vectors)].tobytes()}
            )  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        fast_insert(cursor, Document, docs, now)
        fast_insert(cursor, KnowledgeNode, nodes, now)
        fast_insert(cursor, DenseVector, vectors, now)
        if keywords:
            from retrieval.backends import IndexedNode, get_search_backend

            get_search_backend().index_keywords(
                [IndexedNode(n["id"], space.id, n["document_id"], n["text"]) for n in nodes]
            )
    return len(nodes)


def generate(args) -> dict:
    from types import SimpleNamespace

    from django.core.management import call_command

    from retrieval.index_versions import ensure_active_version
    from spaces.models import PublicationHead
    from spaces.services import Principal, create_space

    call_command("migrate", verbosity=0)
    space = create_space(Principal(tenant_id=TENANT), name="Dense refresh", slug=SLUG)
    version = ensure_active_version(
        space, default_model=SimpleNamespace(model_id=MODEL_ID, dimension=args.dim)
    )
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    written, batch = 0, 1000
    while written < args.size:
        count = min(batch, (args.size - written) // args.chunks)
        written += write_documents(
            space, version, count, args.chunks, rng, tag=f"b{written}", keywords=args.keywords
        )
    PublicationHead.objects.advance(space.id)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"chunks": written, "dimension": args.dim, "load_s": round(time.perf_counter() - t0, 1)}


def pct(values: list[float], q: int) -> float:
    return round(float(np.percentile(values, q)), 2)


def measure(args) -> dict:
    from retrieval.backends import get_search_backend
    from retrieval.recall import resolve_snapshot
    from spaces.models import KnowledgeSpace, PublicationHead

    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=SLUG)
    backend = get_search_backend()
    rng = np.random.default_rng(SEED + 1)

    def query(vector) -> tuple[float, int]:
        snapshot = resolve_snapshot(space)
        number, _, dimension = snapshot.version
        t0 = time.perf_counter()
        hits = backend.dense_search(
            space.id, vector, index_version=number, head_revision=snapshot.head_revision,
            limit=DEPTH, dimension=dimension,
        )  # fmt: skip
        return (time.perf_counter() - t0) * 1000, len(hits)

    version = resolve_snapshot(space).version
    dim = version[2]
    queries = unit(rng, args.queries, dim)
    cold_ms, _ = query(queries[0])
    stats = getattr(backend, "dense_stats", lambda: {})
    cold_stats = stats()
    steady = [query(q)[0] for q in queries]
    from retrieval.models import IndexVersion

    index = IndexVersion.objects.get(space=space, number=version[0])
    after, refresh_rows = [], []
    for p in range(args.publishes):
        write_documents(space, index, 1, args.chunks, rng, tag=f"pub{p}-{time.time_ns()}")
        PublicationHead.objects.advance(space.id)
        ms, found = query(queries[p % len(queries)])
        after.append(ms)
        refresh_rows.append(stats().get("last_refresh_rows"))
        steady_between = [query(q)[0] for q in queries[:5]]  # back to steady
        del steady_between
    return {
        "cold_ms": round(cold_ms, 1),
        "steady_p50_ms": pct(steady, 50),
        "steady_p95_ms": pct(steady, 95),
        "after_publish_ms": [round(x, 1) for x in after],
        "after_publish_p50_ms": pct(after, 50),
        "after_publish_max_ms": round(max(after), 1),
        "refresh_rows": refresh_rows,
        "stats_after_cold": cold_stats,
        "stats": stats(),
        "load_avg": os.getloadavg(),
    }


def bridge_ids(args) -> dict:
    """The Dify bridge's authorized ids of the space, CPU seconds per leg (median of
    ``--queries``, at most 5): the ORM values (one ``uuid.UUID`` per id) turned into canonical
    strings one by one, as before, against the strings the database makes now."""
    from django.db.models import F

    from knowledgefs.dify.bridge_store import identifier, unique_ids
    from knowledgefs.dify.errors import DifyError
    from retrieval.backends.dify import DifyBridgeBackend
    from retrieval.models import DenseVector
    from spaces.models import KnowledgeSpace

    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=SLUG)
    dimension = args.dim

    def before():
        rows = DenseVector.objects.filter(
            space_id=space.id, index_version=1, dimension=dimension,
            node__generation=F("node__document__active_generation"), node__document__enabled=True,
        )  # fmt: skip
        ids = list(rows.order_by("node_id").values_list("node_id", flat=True))
        return [identifier(i, "ids[]", DifyError) for i in ids]

    def after():
        ids = DifyBridgeBackend.authorized_vector_ids(space.id, 1, dimension, None)
        return unique_ids(ids, DifyError)

    out = {}
    for name, fn in (("before", before), ("after", after)):
        cpu = []
        for _ in range(min(args.queries, 5)):
            t0 = time.process_time()
            ids = fn()
            cpu.append(time.process_time() - t0)
        out[f"{name}_cpu_s"] = round(float(np.median(cpu)), 3)
        out[f"{name}_ids"] = len(ids)
    assert before() == after()
    return out


def ab(args) -> dict:
    """The dense leg of ``--baseline`` (another checkout's ``retrieval/backends/base.py``, loaded
    as a module beside this one) and of this checkout on the same space, in one process, one
    query each in turn: cold build, p50/p95 of ``--queries``, and how many top-50 lists agree."""
    import importlib.util

    from retrieval.backends import get_search_backend
    from retrieval.recall import resolve_snapshot
    from spaces.models import KnowledgeSpace

    spec = importlib.util.spec_from_file_location("baseline_base", args.baseline)
    baseline = importlib.util.module_from_spec(spec)
    sys.modules["baseline_base"] = baseline
    spec.loader.exec_module(baseline)
    space = KnowledgeSpace.objects.get(tenant_id=TENANT, slug=SLUG)
    snapshot = resolve_snapshot(space)
    number, _, dimension = snapshot.version
    backends = {"before": baseline.SearchBackend(), "after": get_search_backend()}

    def run(backend, vector):
        t0 = time.perf_counter()
        hits = backend.dense_search(
            space.id, vector, index_version=number, head_revision=snapshot.head_revision,
            limit=DEPTH, dimension=dimension,
        )  # fmt: skip
        return (time.perf_counter() - t0) * 1000, [h.node_id for h in hits]

    queries = unit(np.random.default_rng(SEED + 2), args.queries, dimension)
    out = {f"{name}_cold_ms": round(run(b, queries[0])[0], 1) for name, b in backends.items()}
    times: dict[str, list] = {name: [] for name in backends}
    agree = 0
    for vector in queries:
        found = {}
        for name, backend in backends.items():
            ms, found[name] = run(backend, vector)
            times[name].append(ms)
        agree += found["before"] == found["after"]
    for name, values in times.items():
        out[f"{name}_p50_ms"], out[f"{name}_p95_ms"] = pct(values, 50), pct(values, 95)
    out["identical_top50"] = f"{agree}/{len(queries)}"
    out["load_avg"] = os.getloadavg()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("generate", "measure", "bridge-ids", "ab"))
    parser.add_argument("--var", type=Path, required=True)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=10, help="nodes per document")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--publishes", type=int, default=10)
    parser.add_argument("--baseline", type=Path, help="ab: an older retrieval/backends/base.py")
    parser.add_argument("--keywords", action="store_true", help="generate: keyword rows too")
    parser.add_argument("--copy", type=Path, help="measure on a copy of --var made here")
    args = parser.parse_args()
    var = args.var
    if args.command == "measure" and args.copy:
        shutil.rmtree(args.copy, ignore_errors=True)
        shutil.copytree(var, args.copy)
        var = args.copy
    var.mkdir(parents=True, exist_ok=True)
    setup(var)
    commands = {"generate": generate, "measure": measure, "bridge-ids": bridge_ids, "ab": ab}
    result = commands[args.command](args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
