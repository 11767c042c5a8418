from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0004_artifact_retained_bytes"),
    ]

    operations = [
        migrations.AddField(
            model_name="parseartifact",
            name=name,
            field=models.JSONField(blank=True, default=list),
        )
        for name in ("assets", "ocr_pages", "warnings")
    ]
