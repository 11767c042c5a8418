"""PostgreSQL + pgvector: the dense column, its HNSW indexes and what readiness checks.

Schema (migration ``retrieval.0008``, PostgreSQL only): ``retrieval_densevector.embedding`` is a
``vector`` column *without* a fixed dimension, filled beside the portable float32 copy in
``vector`` (bytes) by :meth:`~retrieval.backends.postgres.PostgresSearchBackend.index_dense`.
One table serves every model and dimension; each ``(model_id, dimension)`` pair gets its own
partial HNSW index over the column cast to that dimension::

    CREATE INDEX retrieval_dense_hnsw_<hash> ON retrieval_densevector
        USING hnsw ((embedding::vector(D)) vector_ip_ops) WITH (m = …, ef_construction = …)
        WHERE model_id = '<model>' AND dimension = D

so no index ever mixes two models (their vectors are not comparable) and a query, which names
its version's model and dimension, matches exactly one index. ``<hash>`` is the first 16 hex
digits of SHA-256 of ``"<model_id>\\0<dimension>"`` (:func:`index_name`): deterministic, so
every process creates the same index and ``IF NOT EXISTS`` makes creation idempotent.

Why DDL at run time: embedding models are configured per tenant and space (a local model, or
any model of a Dify plugin, whose dimension is only known once it answered), so the set of
``(model, dimension)`` pairs is not known when migrations run. The migration creates the
indexes of the pairs that exist then plus the default local model's; :mod:`retrieval.index_versions`
calls :func:`ensure_hnsw_index` whenever it creates an index version, and the rebuild task
calls it again before filling a version (a crash between the two leaves no pair without its
index for long). Outside a transaction the index is built ``CONCURRENTLY`` (writers are not
blocked); an interrupted concurrent build leaves an invalid index, which is dropped and built
again by the next call.

Inner product (``vector_ip_ops``, operator ``<#>``, which returns the *negative* inner product)
is the exact path's measure (:meth:`SearchBackend.dense_search` multiplies unit vectors); both
model runtimes L2-normalise every vector, so it is the cosine similarity. HNSW indexes hold at
most 2,000 dimensions of ``vector`` and 4,000 of ``halfvec`` (pgvector 0.8 limits): a model of
2,001..4,000 dimensions is indexed as ``halfvec`` (the final order is computed again in full
precision), a larger one gets no index and is searched exactly.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
from django.conf import settings
from django.db import DatabaseError, transaction

logger = logging.getLogger("knowledgefs.retrieval")

EXTENSION = "vector"
#: Iterative index scans (``hnsw.iterative_scan``) arrived in pgvector 0.8.0.
MIN_VERSION = (0, 8, 0)
TABLE = "retrieval_densevector"
COLUMN = "embedding"
INDEX_PREFIX = "retrieval_dense_hnsw_"
#: pgvector 0.8: an HNSW index holds ``vector`` up to 2,000 and ``halfvec`` up to 4,000 dims.
VECTOR_MAX_DIMENSION = 2000
HALFVEC_MAX_DIMENSION = 4000


def index_name(model_id: str, dimension: int) -> str:
    """``retrieval_dense_hnsw_<16 hex digits>``: the HNSW index of one model and dimension
    (37 characters, under PostgreSQL's 63)."""
    digest = hashlib.sha256(f"{model_id}\0{int(dimension)}".encode()).hexdigest()
    return f"{INDEX_PREFIX}{digest[:16]}"


def index_type(dimension: int) -> str | None:
    """The pgvector type the HNSW index of ``dimension`` casts to (``vector``, ``halfvec``), or
    ``None`` above :data:`HALFVEC_MAX_DIMENSION` (no index: exact search)."""
    if 1 <= dimension <= VECTOR_MAX_DIMENSION:
        return "vector"
    if dimension <= HALFVEC_MAX_DIMENSION:
        return "halfvec"
    return None


def indexed_expression(dimension: int, alias: str = "") -> str:
    """The expression the index of ``dimension`` is built on; a query must order by exactly
    this expression (``alias``: a table alias such as ``"v."``) to use it."""
    kind = index_type(dimension) or "vector"
    return f"({alias}{COLUMN}::{kind}({int(dimension)}))"


def vector_literal(values: np.ndarray) -> str:
    """pgvector's text form ``[x,y,…]`` of one float32 row; Python's shortest repr of each
    float32 reads back as the same float32, so the stored vector equals the bytes copy."""
    return "[" + ",".join(map(repr, np.asarray(values, dtype=np.float32).tolist())) + "]"


# --- the extension ----------------------------------------------------------------------------


def extension_problem(connection) -> str | None:
    """``None`` when pgvector ≥ 0.8 is installed in the database and the ``embedding`` column
    exists; otherwise one operator-facing line naming what is missing (used by the ``search``
    readiness check, the system check and :func:`retrieval.backends.get_search_backend`)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT extversion FROM pg_extension WHERE extname = %s), "
            "(SELECT default_version FROM pg_available_extensions WHERE name = %s), "
            "EXISTS (SELECT 1 FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s AND column_name = %s)",
            [EXTENSION, EXTENSION, TABLE, COLUMN],
        )
        installed, available, has_column = cursor.fetchone()
    wanted = ".".join(map(str, MIN_VERSION))
    if installed is None and available is None:
        return (
            f"PostgreSQL extension {EXTENSION!r} (pgvector) is not available on this server: "
            f"install pgvector >= {wanted} (e.g. the pgvector/pgvector image or the "
            "postgresql-NN-pgvector package), then run migrations"
        )
    if installed is None or not has_column:
        return (
            f"PostgreSQL extension {EXTENSION!r} (pgvector {available or installed}) is not set up "
            "in this database: run migrations (retrieval.0008 creates it)"
        )
    if _version(installed) < MIN_VERSION:
        return (
            f"PostgreSQL extension {EXTENSION!r} is version {installed}; iterative HNSW scans "
            f"need pgvector >= {wanted} (ALTER EXTENSION vector UPDATE after upgrading it)"
        )
    return None


def availability_problem(connection) -> str | None:
    """``None`` when the server can install pgvector ≥ 0.8 (``pg_available_extensions``); else
    the reason. Checked before migrating, when the extension is not created yet."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = %s", [EXTENSION]
        )
        row = cursor.fetchone()
    wanted = ".".join(map(str, MIN_VERSION))
    if row is None:
        return (
            f"PostgreSQL extension {EXTENSION!r} (pgvector) is not available on this server: "
            f"install pgvector >= {wanted} (e.g. the pgvector/pgvector image or the "
            "postgresql-NN-pgvector package)"
        )
    if _version(row[0]) < MIN_VERSION:
        return f"PostgreSQL extension {EXTENSION!r} is version {row[0]}; need >= {wanted}"
    return None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


# --- HNSW indexes -----------------------------------------------------------------------------


def ensure_hnsw_index(connection, model_id: str, dimension: int) -> str | None:
    """Create the HNSW index of ``(model_id, dimension)`` unless it exists; returns its name
    (``None``: a dimension too large to index, searched exactly).

    Inside a transaction the index is created in it (``CREATE INDEX IF NOT EXISTS``, which holds
    a SHARE lock on the table until commit); outside one it is built ``CONCURRENTLY``. An
    invalid index left by an interrupted concurrent build is dropped first. Build parameters:
    ``KNOWLEDGE_PG_HNSW_M`` and ``KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION``. Raises
    :class:`django.db.DatabaseError` when PostgreSQL refuses the statement.
    """
    kind = index_type(int(dimension))
    name = index_name(model_id, dimension)
    if kind is None:
        logger.warning(
            "no HNSW index for %s: %d dimensions exceed pgvector's %d; dense search is exact",
            model_id,
            dimension,
            HALFVEC_MAX_DIMENSION,
        )
        return None
    state = _index_state(connection, name)
    if state == "valid":
        return name
    concurrently = not connection.in_atomic_block
    if state == "invalid":
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {name}")
    predicate = connection.ops.compose_sql(
        "model_id = %s AND dimension = %s", [model_id, int(dimension)]
    )
    statement = (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {name} "
        f"ON {TABLE} USING hnsw ({indexed_expression(int(dimension))} {kind}_ip_ops) "
        f"WITH (m = {int(settings.KNOWLEDGE_PG_HNSW_M)}, "
        f"ef_construction = {int(settings.KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION)}) "
        f"WHERE {predicate}"
    )
    try:
        if concurrently:
            with connection.cursor() as cursor:
                cursor.execute(statement)
        else:
            # Deferred foreign-key checks of rows this transaction wrote to the table would make
            # PostgreSQL refuse the index ("pending trigger events"): run them now.
            connection.check_constraints()
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(statement)
    except DatabaseError:
        # Two processes creating the same index: the loser's IF NOT EXISTS can still collide
        # on the catalog's unique name. The winner's index is as good.
        if _index_state(connection, name) is None:
            raise
    logger.info("HNSW index %s for %s (%d dimensions) is in place", name, model_id, dimension)
    return name


def _index_state(connection, name: str) -> str | None:
    """``"valid"``, ``"invalid"`` (an interrupted concurrent build) or ``None`` (absent)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
            [name],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return "valid" if row[0] else "invalid"


def hnsw_indexes(connection) -> dict[str, str]:
    """``{index name: definition}`` of every HNSW index on the dense table (diagnostics, tests)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = %s AND indexname LIKE %s",
            [TABLE, INDEX_PREFIX + "%"],
        )
        return dict(cursor.fetchall())
