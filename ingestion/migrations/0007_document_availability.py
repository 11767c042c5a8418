"""Documents gain availability (``enabled``, default true) and a row version (``row_version``,
starting at 1) for compare-and-set writes of availability and metadata."""

from django.db import migrations, models

from knowledgefs.migration_ops import GuardedReversal


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0006_mysql_one_live_job_per_document"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="enabled",
            field=models.BooleanField(default=True),
        ),
        migrations.AddField(
            model_name="document",
            name="row_version",
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.AddConstraint(
            model_name="document",
            constraint=models.CheckConstraint(
                condition=models.Q(("row_version__gte", 1)), name="document_row_version_positive"
            ),
        ),
        # Last, so that it runs first when reversed: knowledgefs.downgrades.
        GuardedReversal(guard="ingestion.0007_document_availability"),
    ]
