"""PostgreSQL: each keyword node row carries its term vector and its document and generation.

PostgreSQL only (SQLite and MySQL/MariaDB: nothing happens, either way). The keyword leg's
random access (:data:`retrieval.backends.pgkeyword.RANDOM_SQL`) reads a candidate's tf of the
query terms from its one node row instead of probing the postings' primary key per term (at
1M chunks the postings and their two indexes are 21 GB, more than this machine's memory, and
every candidate cost a cold probe and heap page per term: docs/scaling.md), and its
visibility from its document alone instead of its knowledge node and then its document (a
node's document and generation never change).

Forwards: the four columns (``terms`` and ``tfs`` stored ``MAIN``: compressed in the row, out of
line only when a row outgrows its page), filled from the postings and the knowledge nodes; a
database that ran ``retrieval.0010`` after this change has them already (nothing to do).
Backwards: the columns are dropped (the postings and the nodes still hold it all).
"""

from django.db import migrations

from retrieval.backends import pgkeyword

FORWARD = [
    f"ALTER TABLE {pgkeyword.NODE} ADD COLUMN terms text[] NOT NULL DEFAULT '{{}}', "
    "ADD COLUMN tfs smallint[] NOT NULL DEFAULT '{}', ADD COLUMN document_id uuid, "
    "ADD COLUMN generation uuid",
    f"ALTER TABLE {pgkeyword.NODE} ALTER COLUMN terms SET STORAGE MAIN, "
    "ALTER COLUMN tfs SET STORAGE MAIN",
    f"UPDATE {pgkeyword.NODE} k SET terms = coalesce(p.terms, '{{}}'), "
    "tfs = coalesce(p.tfs, '{}'), document_id = n.document_id, generation = n.generation "
    "FROM ingestion_knowledgenode n LEFT JOIN (SELECT node_id, "
    "array_agg(term ORDER BY term) AS terms, array_agg(tf::smallint ORDER BY term) AS tfs "
    f"FROM {pgkeyword.POSTING} GROUP BY node_id) p ON p.node_id = n.id "
    "WHERE n.id = k.node_id",
]
BACKWARD = [
    f"ALTER TABLE {pgkeyword.NODE} DROP COLUMN terms, DROP COLUMN tfs, DROP COLUMN document_id, "
    "DROP COLUMN generation"
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = %s AND column_name = 'terms'",
            [pgkeyword.NODE],
        )
        if cursor.fetchone():
            return
        for statement in FORWARD:
            cursor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for statement in BACKWARD:
            cursor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("retrieval", "0014_research_task_query_images")]

    operations = [migrations.RunPython(forwards, backwards)]
