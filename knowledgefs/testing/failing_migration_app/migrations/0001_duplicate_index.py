"""Fails on every engine: the second statement creates an index whose name already exists."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    # After the project's tables, so that the run shows them applied before the failure.
    dependencies = [("upgrades", "0001_upgrade_jobs")]

    operations = [
        migrations.CreateModel(
            name="Probe",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=64)),
            ],
            options={
                "db_table": "failing_probe",
                "indexes": [models.Index(fields=["name"], name="failing_probe_name_idx")],
            },
        ),
        migrations.RunSQL("CREATE INDEX failing_probe_name_idx ON failing_probe (name)"),
    ]
