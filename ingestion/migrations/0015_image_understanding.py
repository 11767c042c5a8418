"""What image understanding did for a generation, kept on its parse artifact."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ingestion", "0014_visual_projections")]

    operations = [
        migrations.AddField(
            model_name="parseartifact",
            name="image_understanding",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
