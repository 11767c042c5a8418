"""PostgreSQL: the keyword leg becomes BM25 impact lists (retrieval.backends.pgkeyword).

PostgreSQL only (SQLite and MySQL/MariaDB: nothing happens, either way). Forwards: the posting,
node, term and space-statistics tables and their indexes, filled from the nodes of every space
that had keyword rows (:func:`retrieval.backends.pgkeyword.rebuild`), then the tsvector table of
``retrieval.0002`` is dropped (its GIN index ranked every matching row; nothing reads it now).

Backwards: the tsvector table and its indexes are created again exactly as ``retrieval.0002``
made them and refilled from the text of every node that has keyword postings
(``to_tsvector('english', keyword_text(text))``, as that backend wrote them); then the four
tables are dropped.
"""

from django.db import migrations

from retrieval.backends import pgkeyword

CREATE = [
    f"CREATE TABLE {pgkeyword.POSTING} ("
    " node_id uuid NOT NULL,"
    ' term text COLLATE "C" NOT NULL,'
    " space_id uuid NOT NULL,"
    " tf integer NOT NULL,"
    " impact real NOT NULL,"
    " PRIMARY KEY (node_id, term))",
    f"CREATE INDEX retrieval_keyword_posting_list ON {pgkeyword.POSTING} "
    "(space_id, term, impact, node_id)",
    f"CREATE TABLE {pgkeyword.NODE} ("
    " node_id uuid PRIMARY KEY,"
    " space_id uuid NOT NULL,"
    " length integer NOT NULL,"
    # retrieval.0015's term vector (here too, so this migration's rebuild can write it).
    " terms text[] NOT NULL DEFAULT '{}',"
    " tfs smallint[] NOT NULL DEFAULT '{}',"
    " document_id uuid,"
    " generation uuid)",
    f"CREATE INDEX retrieval_keyword_node_space ON {pgkeyword.NODE} (space_id)",
    f"ALTER TABLE {pgkeyword.NODE} ALTER COLUMN terms SET STORAGE MAIN, "
    "ALTER COLUMN tfs SET STORAGE MAIN",
    f"CREATE TABLE {pgkeyword.TERM} ("
    " space_id uuid NOT NULL,"
    ' term text COLLATE "C" NOT NULL,'
    " df integer NOT NULL,"
    " PRIMARY KEY (space_id, term))",
    f"CREATE TABLE {pgkeyword.SPACE} ("
    " space_id uuid PRIMARY KEY,"
    " nodes bigint NOT NULL,"
    " length bigint NOT NULL,"
    " avgdl double precision NOT NULL)",
]
# retrieval.0002's PostgreSQL table, verbatim.
TSV_CREATE = [
    "CREATE TABLE retrieval_keyword_tsv ("
    " node_id uuid PRIMARY KEY,"
    " space_id uuid NOT NULL,"
    " tsv tsvector NOT NULL)",
    "CREATE INDEX retrieval_keyword_tsv_gin ON retrieval_keyword_tsv USING GIN (tsv)",
    "CREATE INDEX retrieval_keyword_tsv_space ON retrieval_keyword_tsv (space_id)",
]
REFILL_BATCH = 1000


def to_postings(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for statement in CREATE:
            cursor.execute(statement)
        cursor.execute("SELECT DISTINCT space_id FROM retrieval_keyword_tsv ORDER BY 1")
        for (space_id,) in cursor.fetchall():
            pgkeyword.rebuild(cursor, space_id)
        cursor.execute("DROP TABLE retrieval_keyword_tsv")


def to_tsvector(apps, schema_editor):
    from retrieval.text import keyword_text

    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for statement in TSV_CREATE:
            cursor.execute(statement)
        after = "00000000-0000-0000-0000-000000000000"
        while True:
            cursor.execute(
                f"SELECT k.node_id, k.space_id, n.text FROM {pgkeyword.NODE} k "
                "JOIN ingestion_knowledgenode n ON n.id = k.node_id "
                "WHERE k.node_id > %s ORDER BY k.node_id LIMIT %s",
                [after, REFILL_BATCH],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            cursor.execute(
                "INSERT INTO retrieval_keyword_tsv (node_id, space_id, tsv) "
                "SELECT i, s, to_tsvector('english', t) "
                "FROM unnest(%s::uuid[], %s::uuid[], %s::text[]) u(i, s, t)",
                [[r[0] for r in rows], [r[1] for r in rows], [keyword_text(r[2]) for r in rows]],
            )
            after = rows[-1][0]
        for table in (pgkeyword.POSTING, pgkeyword.NODE, pgkeyword.TERM, pgkeyword.SPACE):
            cursor.execute(f"DROP TABLE {table}")


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0009_sqlite_keyword_tantivy"),
        ("ingestion", "0001_initial"),
    ]

    operations = [migrations.RunPython(to_postings, to_tsvector)]
