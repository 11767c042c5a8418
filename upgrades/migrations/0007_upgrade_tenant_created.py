"""An index for a tenant's upgrade list, newest first with the id breaking ties: the keyset
pages of ``GET /internal/dataset-upgrades`` and ``kfs upgrade list`` read
``(tenant_id, created_at, id)``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("spaces", "0005_space_profiles"),
        ("upgrades", "0006_sweep_schedule"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="upgradejob",
            index=models.Index(
                fields=["tenant_id", "-created_at", "-id"], name="upgrade_job_tenant_idx"
            ),
        ),
    ]
