"""An index for a space's job list, newest first with the id breaking ties: the keyset pages of
``GET /v1/knowledge-spaces/{id}/jobs`` and ``kfs jobs`` read ``(space, created_at, id)``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0007_document_availability"),
        ("spaces", "0005_space_profiles"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="compilationjob",
            index=models.Index(fields=["space", "-created_at", "-id"], name="job_space_created"),
        ),
    ]
