"""Index versions: a space's dense vectors belong to one version, one model, one dimension.

Adds :class:`IndexVersion` and rebuilds the dense-vector table with an ``index_version`` column
and a surrogate key (a node now has one vector per version). Every space with a frozen embedding
model gets version 1, active, with that model; existing vectors are carried into version 1
(only rows of the space's model and dimension, so version 1 never mixes dimensions).

The new table is created beside the old one, filled by one ``INSERT … SELECT``, and renamed
into place once the old table is dropped, so index and constraint names never collide on
PostgreSQL. Reversing keeps only the vectors of each space's active version.
"""

import django.db.models.deletion
import uuid
from django.db import migrations, models
from django.utils import timezone

LOCAL_MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
LOCAL_DIMENSION = 384


def _settle_constraints(schema_editor):
    # PostgreSQL checks foreign keys at commit; a table with pending checks cannot be altered
    # (renamed, dropped) in the same transaction, so check them now.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.connection.check_constraints()


def _execute_dml(schema_editor, sql):
    # A data statement, run through a cursor inside this migration's transaction:
    # schema_editor.execute refuses any statement inside a transaction on MySQL/MariaDB (whose
    # DDL cannot be rolled back), though INSERT … SELECT is ordinary transactional DML there.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql)


def carry_vectors_into_version_one(apps, schema_editor):
    KnowledgeSpace = apps.get_model("spaces", "KnowledgeSpace")
    IndexVersion = apps.get_model("retrieval", "IndexVersion")
    OldVector = apps.get_model("retrieval", "DenseVector")
    NewVector = apps.get_model("retrieval", "DenseVectorV2")
    now = timezone.now()
    stored = {}
    for space_id, model_id, dimension in (
        OldVector.objects.values_list("space_id", "model_id", "dimension").distinct().iterator()
    ):
        stored.setdefault(space_id, (model_id, dimension))
    versions = []
    for space in KnowledgeSpace.objects.only("id", "embedding_model_id", "embedding_dimension"):
        model_id, dimension = space.embedding_model_id, space.embedding_dimension
        if not model_id and space.id in stored:
            model_id, dimension = stored[space.id]
            KnowledgeSpace.objects.filter(id=space.id).update(
                embedding_model_id=model_id, embedding_dimension=dimension
            )
        if not model_id:
            continue  # no document admitted yet: the first upload creates version 1
        if not dimension:
            if stored.get(space.id, ("",))[0] == model_id:
                dimension = stored[space.id][1]
            else:
                dimension = LOCAL_DIMENSION if model_id == LOCAL_MODEL_ID else 0
        versions.append(
            IndexVersion(
                id=uuid.uuid4(),
                space_id=space.id,
                number=1,
                model_id=model_id,
                dimension=dimension,
                state="active",
                activated_at=now,
            )
        )
    IndexVersion.objects.bulk_create(versions, batch_size=500)
    quote = schema_editor.quote_name
    new, old, version = (
        quote(NewVector._meta.db_table),
        quote(OldVector._meta.db_table),
        quote(IndexVersion._meta.db_table),
    )
    _execute_dml(
        schema_editor,
        f"INSERT INTO {new} (node_id, space_id, index_version, model_id, dimension, vector) "
        f"SELECT d.node_id, d.space_id, 1, d.model_id, d.dimension, d.vector FROM {old} d "
        f"JOIN {version} v ON v.space_id = d.space_id AND v.number = 1 "
        "AND v.model_id = d.model_id AND v.dimension = d.dimension"
    )
    _settle_constraints(schema_editor)


def keep_active_vectors_only(apps, schema_editor):
    IndexVersion = apps.get_model("retrieval", "IndexVersion")
    OldVector = apps.get_model("retrieval", "DenseVector")
    NewVector = apps.get_model("retrieval", "DenseVectorV2")
    quote = schema_editor.quote_name
    new, old, version = (
        quote(NewVector._meta.db_table),
        quote(OldVector._meta.db_table),
        quote(IndexVersion._meta.db_table),
    )
    _execute_dml(
        schema_editor,
        f"INSERT INTO {old} (node_id, space_id, model_id, dimension, vector) "
        f"SELECT d.node_id, d.space_id, d.model_id, d.dimension, d.vector FROM {new} d "
        f"JOIN {version} v ON v.space_id = d.space_id AND v.number = d.index_version "
        "AND v.state = 'active'"
    )
    _settle_constraints(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("ingestion", "0001_initial"),
        ("retrieval", "0002_keyword_index"),
        ("spaces", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="IndexVersion",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("number", models.PositiveIntegerField()),
                ("model_id", models.CharField(max_length=200)),
                ("dimension", models.PositiveIntegerField()),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("building", "Building"),
                            ("active", "Active"),
                            ("retired", "Retired"),
                        ],
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("activated_at", models.DateTimeField(blank=True, null=True)),
                ("retired_at", models.DateTimeField(blank=True, null=True)),
                ("progress_at", models.DateTimeField(blank=True, null=True)),
                ("vectors_purged_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                (
                    "space",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="index_versions",
                        to="spaces.knowledgespace",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["state", "progress_at"], name="index_version_progress")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("space", "number"), name="index_version_number"
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(("state", "active")),
                        fields=("space",),
                        name="one_active_index_version",
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(("state", "building")),
                        fields=("space",),
                        name="one_building_index_version",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="DenseVectorV2",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("index_version", models.PositiveIntegerField()),
                ("model_id", models.CharField(max_length=200)),
                ("dimension", models.PositiveIntegerField()),
                ("vector", models.BinaryField()),
                (
                    "node",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dense_vectors",
                        to="ingestion.knowledgenode",
                    ),
                ),
                (
                    "space",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="spaces.knowledgespace",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["space", "index_version"], name="dense_space_version")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("node", "index_version"), name="dense_node_version"
                    )
                ],
            },
        ),
        migrations.RunPython(carry_vectors_into_version_one, keep_active_vectors_only),
        migrations.DeleteModel(name="DenseVector"),
        migrations.RenameModel(old_name="DenseVectorV2", new_name="DenseVector"),
    ]
