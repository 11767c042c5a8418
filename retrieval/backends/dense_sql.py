"""The SQL of the in-process dense matrix (:mod:`.dense_matrix`): reading a version's rows after
an id, checking rows and documents. Statements take one parameter for a list of ids (SQLite
``json_each``, PostgreSQL ``ANY``); SQLite stores UUIDs as 32 hex characters."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db import connection

from ingestion.models import Document, KnowledgeNode
from retrieval.models import DenseVector

#: Rows fetched at a time by a read (bounds the transient Python objects of a cold read).
READ_BATCH = 20000

_VISIBLE = "CASE WHEN n.generation = d.active_generation AND d.enabled THEN 1 ELSE 0 END"


def _tables() -> tuple[str, str, str]:
    q = connection.ops.quote_name
    return (
        q(DenseVector._meta.db_table),
        q(KnowledgeNode._meta.db_table),
        q(Document._meta.db_table),
    )


def _uuid_param(value: uuid.UUID):
    return value.hex if connection.vendor == "sqlite" else value  # SQLite stores 32 hex chars


def _node_hex_sql() -> str:
    if connection.vendor == "sqlite":
        return "CAST(dv.node_id AS BLOB)"  # the stored 32 hex characters, as bytes
    return "replace(CAST(dv.node_id AS text), '-', '')"


def _ids_condition(column: str, ids: list[int]) -> tuple[str, list]:
    """``column IN ids`` with one parameter (SQLite ``json_each``, PostgreSQL ``ANY``)."""
    if connection.vendor == "sqlite":
        listed = "[" + ",".join(map(str, ids)) + "]"
        return f"{column} IN (SELECT value FROM json_each(%s))", [listed]
    return f"{column} = ANY(%s)", [list(ids)]


def count_rows(space_id: uuid.UUID, index_version: int) -> int:
    """Rows of the version (the ``(space, index_version)`` index alone)."""
    vectors, _, _ = _tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {vectors} WHERE space_id = %s AND index_version = %s",
            [_uuid_param(space_id), index_version],
        )
        return cursor.fetchone()[0]


def read_rows(space_id: uuid.UUID, index_version: int, dimension: int, after_id: int):
    """The version's rows with ``id > after_id`` in id order, in lists of at most
    :data:`READ_BATCH`, as ``(id, node hex, document id, fits, visible, generation, vector)``:
    ``fits`` is
    1 when the row has ``dimension`` (and its bytes), and ``visible`` 1 when its generation is
    the document's active one and the document enabled. One statement, served by the
    ``(space, index_version)`` index and the primary key."""
    vectors, nodes, documents = _tables()
    sql = (
        f"SELECT dv.id, {_node_hex_sql()}, n.document_id, "
        f"CASE WHEN dv.dimension = %s AND length(dv.vector) = %s THEN 1 ELSE 0 END, "
        f"{_VISIBLE}, n.generation, dv.vector "
        f"FROM {vectors} dv JOIN {nodes} n ON n.id = dv.node_id "
        f"JOIN {documents} d ON d.id = n.document_id "
        f"WHERE dv.space_id = %s AND dv.index_version = %s AND dv.id > %s ORDER BY dv.id"
    )
    params = [dimension, 4 * dimension, _uuid_param(space_id), index_version, after_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while batch := cursor.fetchmany(READ_BATCH):
            yield batch


def visibility(row_ids: list[int]) -> dict[int, bool]:
    """``{row id: visible}`` for the rows that still exist (a missing id: the row is gone).
    One statement for all of them."""
    if not row_ids:
        return {}
    vectors, nodes, documents = _tables()
    condition, params = _ids_condition("dv.id", row_ids)
    sql = (
        f"SELECT dv.id, {_VISIBLE} FROM {vectors} dv "
        f"JOIN {nodes} n ON n.id = dv.node_id JOIN {documents} d ON d.id = n.document_id "
        f"WHERE {condition}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row_id: bool(visible) for row_id, visible in cursor.fetchall()}


def document_states(ids: list) -> dict:
    """``{document id: (active generation, enabled)}`` for the documents that exist (ids as the
    database gives them). One statement on the documents' primary key."""
    if not ids:
        return {}
    _, _, documents = _tables()
    params: list[Any]
    if connection.vendor == "sqlite":
        condition, params = "id IN (SELECT value FROM json_each(%s))", [json.dumps(ids)]
    else:
        condition, params = "id = ANY(%s)", [list(ids)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, active_generation, enabled FROM {documents} WHERE {condition}", params
        )
        return {d: (generation, enabled) for d, generation, enabled in cursor.fetchall()}


def visible_hex(node_hex: list[str]) -> set[str]:
    """The node ids of ``node_hex`` (32 lowercase hex characters each, as SQLite stores them)
    whose generation is their document's active one and whose document is enabled, as given:
    one statement on the nodes' primary key, no UUID built on SQLite (the tantivy leg's path;
    PostgreSQL reads the same hex ids as ``uuid`` input, for the engine comparison tests)."""
    if not node_hex:
        return set()
    _, nodes, documents = _tables()
    params: list[Any]
    if connection.vendor == "sqlite":
        condition = "n.id IN (SELECT value FROM json_each(%s))"
        params = ["[" + ",".join(f'"{h}"' for h in node_hex) + "]"]
    else:
        condition, params = "n.id = ANY(%s::uuid[])", [list(node_hex)]
    sql = (
        f"SELECT n.id FROM {nodes} n JOIN {documents} d ON d.id = n.document_id "
        f"WHERE {condition} AND n.generation = d.active_generation AND d.enabled"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] if isinstance(row[0], str) else row[0].hex for row in cursor.fetchall()}
