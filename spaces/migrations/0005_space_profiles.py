"""Space profiles: one ``SpaceProfile`` row per space (embedding profile, retrieval profile,
readiness).

Every existing space was created under the local runtime (the only one before this), so each
gets the local profile of the model its active index version uses (else the space's
``embedding_model_id``, else the default local model), ``ready``, with the default retrieval
profile; a space that holds documents is frozen at its first document's creation time. Backward,
the table goes (spaces keep their index versions and models).

Portable: plain columns, JSON columns, a one-to-one primary key and check constraints that
SQLite, PostgreSQL and MySQL 8 all enforce; the data step uses the ORM only.
"""

import hashlib
import json

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Min, Q
from django.utils import timezone

LOCAL_MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
PREFIX = "embedding-space-sha256:"


def _vector_space_id(model_id: str) -> str:
    # As spaces.profiles.vector_space_id for a local selection (copied: migrations are frozen).
    payload = json.dumps(
        {
            "selection": {"plugin_id": "local", "provider": "local", "model": model_id},
            "identity": {"model_id": model_id},
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return PREFIX + hashlib.sha256(payload.encode()).hexdigest()


def local_profiles_for_existing_spaces(apps, schema_editor):
    KnowledgeSpace = apps.get_model("spaces", "KnowledgeSpace")
    SpaceProfile = apps.get_model("spaces", "SpaceProfile")
    IndexVersion = apps.get_model("retrieval", "IndexVersion")
    Document = apps.get_model("ingestion", "Document")
    active = {
        space_id: (model_id, dimension)
        for space_id, model_id, dimension in IndexVersion.objects.filter(
            state="active"
        ).values_list("space_id", "model_id", "dimension")
    }
    first_document = dict(
        Document.objects.order_by()
        .values("space_id")
        .annotate(first=Min("created_at"))
        .values_list("space_id", "first")
    )
    now = timezone.now()
    rows = []
    for space_id, model_id, dimension in KnowledgeSpace.objects.values_list(
        "id", "embedding_model_id", "embedding_dimension"
    ).iterator():
        model_id, dimension = active.get(space_id, (model_id or LOCAL_MODEL_ID, dimension))
        rows.append(
            SpaceProfile(
                space_id=space_id,
                embedding_plugin_id="local",
                embedding_provider="local",
                embedding_model=model_id,
                embedding_identity=model_id,
                embedding_dimension=dimension,
                vector_space_id=_vector_space_id(model_id),
                embedding_frozen_at=first_document.get(space_id),
                state="ready",
                validated_at=now,
            )
        )
        if len(rows) >= 500:
            SpaceProfile.objects.bulk_create(rows)
            rows = []
    SpaceProfile.objects.bulk_create(rows)


class Migration(migrations.Migration):
    dependencies = [
        ("spaces", "0004_remove_scoped_and_space_memberships"),
        ("retrieval", "0003_index_versions"),
        ("ingestion", "0004_artifact_retained_bytes"),
    ]

    operations = [
        migrations.CreateModel(
            name="SpaceProfile",
            fields=[
                (
                    "space",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="profile",
                        serialize=False,
                        to="spaces.knowledgespace",
                    ),
                ),
                ("embedding_plugin_id", models.CharField(blank=True, default="", max_length=256)),
                ("embedding_provider", models.CharField(blank=True, default="", max_length=256)),
                ("embedding_model", models.CharField(blank=True, default="", max_length=256)),
                ("embedding_identity", models.CharField(blank=True, default="", max_length=1024)),
                ("embedding_dimension", models.PositiveIntegerField(blank=True, null=True)),
                ("vector_space_id", models.CharField(blank=True, default="", max_length=96)),
                ("embedding_revision", models.PositiveIntegerField(default=1)),
                ("embedding_frozen_at", models.DateTimeField(blank=True, null=True)),
                (
                    "retrieval_default_mode",
                    models.CharField(
                        choices=[
                            ("fast", "Fast"),
                            ("deep", "Deep"),
                            ("research", "Research"),
                            ("auto", "Auto"),
                        ],
                        default="fast",
                        max_length=16,
                    ),
                ),
                ("retrieval_reasoning_model", models.JSONField(blank=True, null=True)),
                ("retrieval_rerank_enabled", models.BooleanField(default=False)),
                ("retrieval_rerank_model", models.JSONField(blank=True, null=True)),
                ("retrieval_score_threshold", models.FloatField(blank=True, null=True)),
                ("retrieval_top_k", models.PositiveSmallIntegerField(default=10)),
                ("retrieval_revision", models.PositiveIntegerField(default=1)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("setup-required", "Setup required"),
                            ("pending-validation", "Pending validation"),
                            ("validation-failed", "Validation failed"),
                            ("ready", "Ready"),
                        ],
                        default="setup-required",
                        max_length=32,
                    ),
                ),
                ("failure", models.JSONField(blank=True, null=True)),
                ("capabilities", models.JSONField(blank=True, default=dict)),
                ("validated_at", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "space profile",
                "indexes": [models.Index(fields=["state"], name="space_profile_state_idx")],
                "constraints": [
                    models.CheckConstraint(
                        condition=Q(
                            state__in=[
                                "setup-required",
                                "pending-validation",
                                "validation-failed",
                                "ready",
                            ]
                        ),
                        name="space_profile_state",
                    ),
                    models.CheckConstraint(
                        condition=Q(retrieval_top_k__gte=1, retrieval_top_k__lte=100),
                        name="space_profile_top_k",
                    ),
                    models.CheckConstraint(
                        condition=Q(retrieval_score_threshold__isnull=True)
                        | Q(retrieval_score_threshold__gte=0, retrieval_score_threshold__lte=1),
                        name="space_profile_score_threshold",
                    ),
                    models.CheckConstraint(
                        condition=~Q(retrieval_rerank_enabled=True)
                        | Q(retrieval_rerank_model__isnull=False),
                        name="space_profile_rerank_model",
                    ),
                ],
            },
        ),
        migrations.RunPython(local_profiles_for_existing_spaces, migrations.RunPython.noop),
    ]
