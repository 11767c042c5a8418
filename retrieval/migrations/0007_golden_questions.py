"""Golden questions: per-space questions with the evidence a retrieval must return."""

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0006_research_tasks"),
        ("spaces", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="GoldenQuestion",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("tenant_id", models.CharField(max_length=64)),
                ("question", models.TextField()),
                ("expected_evidence", models.JSONField(default=list)),
                ("tags", models.JSONField(blank=True, default=list)),
                ("metadata", models.JSONField(blank=True, default=dict)),
                ("revision", models.PositiveIntegerField(default=1)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "space",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="golden_questions",
                        to="spaces.knowledgespace",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["space", "created_at"], name="golden_question_space_created"
                    )
                ],
            },
        ),
    ]
