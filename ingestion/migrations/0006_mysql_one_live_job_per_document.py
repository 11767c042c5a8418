"""One live compilation job per document on MySQL/MariaDB too.

SQLite and PostgreSQL enforce ``one_live_job_per_document`` as a partial unique index (0001).
MySQL/MariaDB have no partial indexes and Django skips the conditional constraint there, so on
those engines only: a stored generated column that holds the document id while the job is live
(dispatch_pending, queued, running, retry_wait) and NULL otherwise, under a unique index (NULLs
never collide). The column is not in the model state: Django never writes it. A later migration
that alters ``run_state`` or ``document_id`` on MySQL must drop and re-create it.
"""

from django.db import migrations

from knowledgefs.migration_ops import MySQLRunSQL, uuid_column_type

LIVE = "'dispatch_pending', 'queued', 'running', 'retry_wait'"


def statements(connection):
    uuid = uuid_column_type(connection)  # the type of document_id: uuid on MariaDB, else char(32)
    forwards = [
        f"ALTER TABLE ingestion_compilationjob ADD COLUMN live_document_id {uuid} "
        f"AS (CASE WHEN run_state IN ({LIVE}) THEN document_id END) STORED",
        "CREATE UNIQUE INDEX one_live_job_per_document_gen "
        "ON ingestion_compilationjob (live_document_id)",
    ]
    backwards = [
        "DROP INDEX one_live_job_per_document_gen ON ingestion_compilationjob",
        "ALTER TABLE ingestion_compilationjob DROP COLUMN live_document_id",
    ]
    return forwards, backwards


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0005_artifact_assets"),
    ]

    operations = [MySQLRunSQL(statements)]
