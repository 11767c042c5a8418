"""API-key bindings, step 3 of 3 (schema): drop ``ApiKey.scoped`` and the ``ApiKey.spaces``
many-to-many, now that 0003 copied them into ``ApiKeyBinding`` rows.

Backward, both come back empty (``scoped`` false) and 0003's reverse refills them.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("spaces", "0003_bindings_from_scoped_keys"),
    ]

    operations = [
        migrations.RemoveField(model_name="apikey", name="spaces"),
        migrations.RemoveField(model_name="apikey", name="scoped"),
    ]
