"""Create the keyword projection for the database in use.

SQLite: an FTS5 table (Porter stemming over unicode61). PostgreSQL: a tsvector table with a GIN
index. MySQL/MariaDB: an InnoDB table with a FULLTEXT index (MySQL's ngram parser, which splits
CJK text; MariaDB has no ngram parser and uses its default one). Rows are removed by the backend
with their nodes (no foreign key, so that the table stays out of the way of Django's table
flushes).
"""

from django.db import migrations, models

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

# {uuid}: the type Django gives UUID columns there (uuid on MariaDB ≥ 10.7, char(32) on MySQL).
MYSQL_CREATE = (
    "CREATE TABLE retrieval_keyword_ft ("
    " node_id {uuid} NOT NULL PRIMARY KEY,"
    " space_id {uuid} NOT NULL,"
    " document_id {uuid} NOT NULL,"
    " text longtext NOT NULL,"
    " KEY retrieval_keyword_ft_space (space_id),"
    " FULLTEXT KEY retrieval_keyword_ft_text (text){parser}"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
)


def create_keyword_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute(SQLITE_CREATE)
    elif vendor == "postgresql":
        for statement in POSTGRES_CREATE:
            schema_editor.execute(statement)
    elif vendor == "mysql":
        connection = schema_editor.connection
        schema_editor.execute(
            MYSQL_CREATE.format(
                uuid=models.UUIDField().db_type(connection),
                parser="" if connection.mysql_is_mariadb else " WITH PARSER ngram",
            )
        )
    else:
        raise RuntimeError(f"KnowledgeFS has no keyword index for database vendor {vendor!r}")


def drop_keyword_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_fts")
    elif vendor == "postgresql":
        schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_tsv")
    elif vendor == "mysql":
        schema_editor.execute("DROP TABLE IF EXISTS retrieval_keyword_ft")


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0001_initial"),
        ("ingestion", "0001_initial"),
    ]

    # Not wrapped in a transaction of its own: MySQL/MariaDB cannot roll DDL back, and Django
    # refuses DDL inside an atomic block there. SQLite and PostgreSQL still run it inside the
    # migration's transaction.
    operations = [migrations.RunPython(create_keyword_index, drop_keyword_index, atomic=False)]
