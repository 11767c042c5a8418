"""PostgreSQL: the pgvector column of the dense projection and its HNSW indexes.

PostgreSQL only (SQLite and MySQL/MariaDB: nothing happens, either way). Forwards:
``CREATE EXTENSION IF NOT EXISTS vector``; a ``vector`` column ``embedding`` without a fixed
dimension on ``retrieval_densevector`` (the float32 bytes in ``vector`` stay the portable copy);
existing rows are filled from those bytes in batches; then one partial HNSW index per
``(model_id, dimension)`` of a live index version, plus the default local model's
(:mod:`retrieval.backends.pgvector` names and builds them). A server without pgvector stops
here with a message naming the extension.

Backwards: the HNSW indexes and the column are dropped. The extension stays: it may serve
other objects of the database, dropping it needs the privilege that created it, and keeping it
keeps the type's identity, so migrating forward again gives the same schema.
"""

from django.db import migrations

from retrieval.backends import pgvector

LOCAL_MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
LOCAL_DIMENSION = 384
FILL_BATCH = 1000


def add_vector_column(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    problem = pgvector.availability_problem(connection)
    if problem is not None:
        raise RuntimeError(f"retrieval.0008: {problem}")
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        cursor.execute(f"ALTER TABLE {pgvector.TABLE} ADD COLUMN {pgvector.COLUMN} vector NULL")
    _fill_existing(apps, connection)
    IndexVersion = apps.get_model("retrieval", "IndexVersion")
    pairs = set(
        IndexVersion.objects.filter(state__in=("active", "building"))
        .values_list("model_id", "dimension")
        .distinct()
    )
    pairs.add((LOCAL_MODEL_ID, LOCAL_DIMENSION))
    for model_id, dimension in sorted(pairs):
        if dimension:
            pgvector.ensure_hnsw_index(connection, model_id, dimension)


def _fill_existing(apps, connection):
    import numpy as np

    DenseVector = apps.get_model("retrieval", "DenseVector")
    last = 0
    while True:
        rows = list(
            DenseVector.objects.filter(id__gt=last)
            .order_by("id")
            .values_list("id", "dimension", "vector")[:FILL_BATCH]
        )
        if not rows:
            return
        updates = [
            (pgvector.vector_literal(np.frombuffer(bytes(vector), dtype="<f4")), row_id)
            for row_id, dimension, vector in rows
            if dimension and len(vector) == 4 * dimension
        ]
        with connection.cursor() as cursor:
            cursor.executemany(
                f"UPDATE {pgvector.TABLE} SET {pgvector.COLUMN} = %s::vector WHERE id = %s",
                updates,
            )
        last = rows[-1][0]


def drop_vector_column(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in pgvector.hnsw_indexes(connection):
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
        cursor.execute(f"ALTER TABLE {pgvector.TABLE} DROP COLUMN IF EXISTS {pgvector.COLUMN}")


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0007_golden_questions"),
    ]

    operations = [migrations.RunPython(add_vector_column, drop_vector_column)]
