"""An index over (space, filename, id): the knowledge filesystem lists a space's documents in
filename order with a keyset cursor (retrieval/fs/listing.py), one index range per page."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ingestion", "0009_node_metadata")]

    operations = [
        migrations.AddIndex(
            model_name="document",
            index=models.Index(
                fields=["space", "filename", "id"], name="document_space_filename"
            ),
        ),
    ]
