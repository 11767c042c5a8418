"""The query images of a research task (their upload file ids, never their bytes)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("retrieval", "0013_triage_run_revision")]

    operations = [
        migrations.AddField(
            model_name="researchtask",
            name="query_images",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
