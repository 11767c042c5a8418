"""Create the keyword projection for the database in use.

SQLite: an FTS5 table (Porter stemming over unicode61). PostgreSQL: a tsvector table with a GIN
index. Rows are removed by the backend with their nodes (no foreign key, so that the table stays
out of the way of Django's table flushes). Other engines get their table with their backend.
"""

from django.db import migrations

# node_id and space_id are indexed columns (one hex token each) so that deleting a node and
# restricting a query to one space are index lookups, not scans of every tenant's rows.
SQLITE_CREATE = (
    "CREATE VIRTUAL TABLE retrieval_keyword_fts USING fts5("
    "text, node_id, space_id, document_id UNINDEXED, "
    "tokenize = 'porter unicode61 remove_diacritics 2')"
)
POSTGRES_CREATE = [
    "CREATE TABLE retrieval_keyword_tsv ("
    " node_id uuid PRIMARY KEY,"
    " space_id uuid NOT NULL,"
    " tsv tsvector NOT NULL)",
    "CREATE INDEX retrieval_keyword_tsv_gin ON retrieval_keyword_tsv USING GIN (tsv)",
    "CREATE INDEX retrieval_keyword_tsv_space ON retrieval_keyword_tsv (space_id)",
]


def create_keyword_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute(SQLITE_CREATE)
    elif vendor == "postgresql":
        for statement in POSTGRES_CREATE:
            schema_editor.execute(statement)
    else:
        raise RuntimeError(f"KnowledgeFS has no keyword index for database vendor {vendor!r}")


def drop_keyword_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_fts")
    elif vendor == "postgresql":
        schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_tsv")


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0001_initial"),
        ("ingestion", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_keyword_index, drop_keyword_index)]
