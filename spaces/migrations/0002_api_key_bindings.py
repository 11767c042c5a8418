"""API-key bindings: the typed table that replaces ``ApiKey.spaces`` and ``ApiKey.scoped``.

Step 1 of 3 (schema only): create ``ApiKeyBinding`` beside the old many-to-many, and mark spaces
whose deletion has started (``KnowledgeSpace.deleting_at``) so they can no longer be bound.
0003 copies the scoped keys' spaces into bindings; 0004 drops the old columns.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("spaces", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="knowledgespace",
            name="deleting_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="ApiKeyBinding",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "resource_type",
                    models.CharField(
                        choices=[
                            ("knowledge_fs_space", "Knowledge space"),
                            ("dataset", "Dify dataset"),
                        ],
                        max_length=32,
                    ),
                ),
                ("dataset_id", models.CharField(blank=True, max_length=64, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "api_key",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="bindings",
                        to="spaces.apikey",
                    ),
                ),
                (
                    "space",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="api_key_bindings",
                        to="spaces.knowledgespace",
                    ),
                ),
            ],
            options={
                "verbose_name": "API key binding",
                "indexes": [models.Index(fields=["dataset_id"], name="apikey_binding_dataset")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("dataset_id__isnull", True),
                                ("resource_type", "knowledge_fs_space"),
                                ("space__isnull", False),
                            ),
                            models.Q(
                                ("dataset_id__isnull", False),
                                ("resource_type", "dataset"),
                                ("space__isnull", True),
                                models.Q(("dataset_id", ""), _negated=True),
                            ),
                            _connector="OR",
                        ),
                        name="apikey_binding_target",
                        violation_error_message=(
                            "a knowledge-space binding names a space and no dataset; a dataset "
                            "binding names a dataset id and no space"
                        ),
                    ),
                    models.UniqueConstraint(
                        fields=("api_key", "space"),
                        name="apikey_binding_space_unique",
                        violation_error_message="the key is already bound to this space",
                    ),
                    models.UniqueConstraint(
                        fields=("api_key", "dataset_id"),
                        name="apikey_binding_dataset_unique",
                        violation_error_message="the key is already bound to this dataset",
                    ),
                ],
            },
        ),
    ]
