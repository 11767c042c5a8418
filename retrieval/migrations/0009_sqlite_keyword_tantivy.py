"""SQLite: the keyword leg moved to per-space tantivy indexes; drop the FTS5 table.

SQLite only (PostgreSQL and MySQL/MariaDB: nothing happens, either way). Forwards: each space
that has nodes gets its index under ``KNOWLEDGE_VAR_DIR/search/keyword/<space id>/`` built from
its nodes' text (what ``kfs reindex`` writes), then ``DROP TABLE retrieval_keyword_fts``. A run
that stops half-way leaves the table; running it again rebuilds every index.

Backwards: the FTS5 table of ``retrieval.0002`` is created again and refilled from every node's
text (``retrieval.text.keyword_text``, as the previous release wrote it), so the previous release
finds its keyword projection whole. The tantivy indexes stay on disk (derived data; a later
upgrade rebuilds them).
"""

import importlib

from django.db import migrations

from retrieval.text import keyword_text

FILL_BATCH = 1000


def drop_fts(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    from retrieval.keyword_index import analysis, store

    KnowledgeNode = apps.get_model("ingestion", "KnowledgeNode")
    spaces = KnowledgeNode.objects.values_list("space_id", flat=True).distinct()
    for space_id in sorted(set(spaces)):
        rows = KnowledgeNode.objects.filter(space_id=space_id).values_list(
            "id", "document_id", "text"
        )
        with store.rebuilding(space_id) as writer:
            for node_id, document_id, text in rows.iterator(chunk_size=FILL_BATCH):
                writer.add_document(analysis.document(node_id, document_id, keyword_text(text)))
    schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_fts")


def restore_fts(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    create = importlib.import_module("retrieval.migrations.0002_keyword_index").SQLITE_CREATE
    schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_fts")
    schema_editor.execute(create)
    KnowledgeNode = apps.get_model("ingestion", "KnowledgeNode")
    rows = KnowledgeNode.objects.order_by("id").values_list("id", "space_id", "document_id", "text")
    batch = []
    with connection.cursor() as cursor:
        for node_id, space_id, document_id, text in rows.iterator(chunk_size=FILL_BATCH):
            batch.append((keyword_text(text), node_id.hex, space_id.hex, document_id.hex))
            if len(batch) >= FILL_BATCH:
                _insert(cursor, batch)
                batch = []
        if batch:
            _insert(cursor, batch)


def _insert(cursor, batch):
    cursor.executemany(
        "INSERT INTO retrieval_keyword_fts (text, node_id, space_id, document_id) "
        "VALUES (%s, %s, %s, %s)",
        batch,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0008_pgvector"),
        ("ingestion", "0001_initial"),
    ]

    operations = [migrations.RunPython(drop_fts, restore_fts)]
