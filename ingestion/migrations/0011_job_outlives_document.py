"""A compilation job outlives its deleted document: ``document`` becomes nullable and is set to
NULL when the document goes, so an attempt canceled by the delete stays readable as ``canceled``.

On MySQL/MariaDB the generated column ``live_document_id`` of 0006 depends on ``document_id``:
it is dropped before the column changes and created again after it (same definition). Backwards,
the jobs whose document is gone are deleted first (as they were before this migration), then
the column is NOT NULL again.
"""

from django.db import migrations, models
from django.db.models.deletion import SET_NULL

from knowledgefs.migration_ops import MySQLRunSQL, uuid_column_type

LIVE = "'dispatch_pending', 'queued', 'running', 'retry_wait'"


def _create(connection) -> list[str]:
    uuid = uuid_column_type(connection)
    return [
        f"ALTER TABLE ingestion_compilationjob ADD COLUMN live_document_id {uuid} "
        f"AS (CASE WHEN run_state IN ({LIVE}) THEN document_id END) STORED",
        "CREATE UNIQUE INDEX one_live_job_per_document_gen "
        "ON ingestion_compilationjob (live_document_id)",
    ]


_DROP = [
    "DROP INDEX one_live_job_per_document_gen ON ingestion_compilationjob",
    "ALTER TABLE ingestion_compilationjob DROP COLUMN live_document_id",
]


def _delete_orphans(apps, schema_editor) -> None:
    apps.get_model("ingestion", "CompilationJob").objects.filter(document__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("ingestion", "0010_document_space_filename")]

    operations = [
        MySQLRunSQL(lambda connection: (_DROP, _create(connection))),
        migrations.AlterField(
            model_name="compilationjob",
            name="document",
            field=models.ForeignKey(
                null=True,
                on_delete=SET_NULL,
                related_name="jobs",
                to="ingestion.document",
            ),
        ),
        migrations.RunPython(migrations.RunPython.noop, _delete_orphans),
        MySQLRunSQL(lambda connection: (_create(connection), _DROP)),
    ]


