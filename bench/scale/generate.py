"""Scale curve ``generate``: fill one size's space with noisy copies of the SciFact documents by
bulk INSERTs (PostgreSQL vectors by binary ``COPY``; GIN and HNSW dropped before the load and
rebuilt after it, timed); runs inside a worker subprocess with Django set up."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from pathlib import Path

import numpy as np

from .postgres import PG_SETTINGS
from .state import BATCH_DOCUMENTS, TENANT, copy_ids, copy_vectors, layout, load_source, log


# --- generate ------------------------------------------------------------------------------------
def generate_point(engine: str, size: int, part: str = "all") -> dict:
    """Fill the space of ``size`` chunks; ``part`` ``"rows"`` writes everything but the dense
    vectors, ``"dense"`` (after ``"rows"``) migrates again and writes only the vectors and the
    HNSW index, ``"all"`` both (the two-step path lets the PostgreSQL text and keyword load run
    before the pgvector migration exists on the branch)."""
    from django.core.management import call_command
    from django.db import connection

    from retrieval.index_versions import ensure_active_version
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
