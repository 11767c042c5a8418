"""Request and response shapes of the upgrade routes (``/internal/dataset-upgrades``).

Limits (each error names its field and the limit; the body as a whole is also bounded by
Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``, 2 MiB):

* ``documents``: at most :data:`MAX_DOCUMENTS` (5,000) entries, ids unique;
* ``config``/``permission`` snapshots and each document's ``metadata``: JSON objects of at most
  :data:`MAX_SNAPSHOT_BYTES` (64 KiB) / :data:`MAX_METADATA_BYTES` (8 KiB) serialised, metadata
  at most :data:`MAX_METADATA_KEYS` keys;
* ``app_bindings`` and ``tag_ids``: at most 1,000 entries each.
"""

from __future__ import annotations

import json

from rest_framework import serializers

from upgrades.models import UpgradeDocument, UpgradeJob

MAX_DOCUMENTS = 5000
"""Documents per snapshot: 5,000 entries of a few hundred bytes fit the 2 MiB request limit."""
MAX_SNAPSHOT_BYTES = 64 * 1024
MAX_METADATA_BYTES = 8 * 1024
MAX_METADATA_KEYS = 100
MAX_LIST_ITEMS = 1000
APP_BINDING_KINDS = ("agent", "workflow")


def _json_size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


class BoundedJSONObject(serializers.JSONField):
    """A JSON object of at most ``max_bytes`` serialised (and ``max_keys`` keys, if given)."""

    def __init__(self, *, max_bytes: int, max_keys: int | None = None, **kwargs) -> None:
        self.max_bytes = max_bytes
        self.max_keys = max_keys
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        if self.max_keys is not None and len(value) > self.max_keys:
            raise serializers.ValidationError(
                f"has {len(value)} keys; the limit is {self.max_keys}"
            )
        size = _json_size(value)
        if size > self.max_bytes:
            raise serializers.ValidationError(
                f"is {size} bytes as JSON; the limit is {self.max_bytes} bytes"
            )
        return value


class BoundedListField(serializers.ListField):
    """A list whose length is checked before any item is validated (so an oversized list is
    refused at once, naming the limit)."""

    def to_internal_value(self, data):
        if isinstance(data, list | tuple) and self.max_length is not None:
            if len(data) > self.max_length:
                raise serializers.ValidationError(
                    f"has {len(data)} entries; the limit is {self.max_length}",
                    code="max_length",
                )
        return super().to_internal_value(data)


class ConfigSnapshotSerializer(serializers.Serializer):
    """The Dataset configuration; ``name`` becomes the space's name, other keys are kept."""

    name = serializers.CharField(max_length=160)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class AppBindingSerializer(serializers.Serializer):
    app_id = serializers.CharField(max_length=64)
    kind = serializers.ChoiceField(choices=APP_BINDING_KINDS)


class DocumentSnapshotSerializer(serializers.Serializer):
    """One legacy document. ``storage_key`` and ``upload_file_id`` are required for
    ``upload_file`` documents (the only supported source type, checked by the service)."""

    id = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=255, trim_whitespace=False)
    data_source_type = serializers.CharField(max_length=32)
    storage_key = serializers.CharField(
        max_length=1024, required=False, allow_null=True, default=None
    )
    upload_file_id = serializers.CharField(
        max_length=64, required=False, allow_null=True, default=None
    )
    desired_enabled = serializers.BooleanField()
    archived = serializers.BooleanField(required=False, default=False)
    indexing_status = serializers.CharField(
        max_length=32, required=False, allow_blank=True, default=""
    )
    metadata = BoundedJSONObject(
        max_bytes=MAX_METADATA_BYTES, max_keys=MAX_METADATA_KEYS, required=False, default=dict
    )


class SnapshotSerializer(serializers.Serializer):
    """``POST /internal/dataset-upgrades``: the snapshot of one classic Dataset."""

    namespace_id = serializers.CharField(max_length=64)
    dataset_id = serializers.CharField(max_length=64)
    idempotency_key = serializers.CharField(max_length=255)
    requested_by = serializers.CharField(max_length=64)
    owner = serializers.CharField(max_length=64)
    config = BoundedJSONObject(max_bytes=MAX_SNAPSHOT_BYTES)
    permission = BoundedJSONObject(max_bytes=MAX_SNAPSHOT_BYTES, required=False, default=dict)
    app_bindings = BoundedListField(
        child=AppBindingSerializer(), max_length=MAX_LIST_ITEMS, required=False, default=list
    )
    tag_ids = BoundedListField(
        child=serializers.CharField(max_length=64),
        max_length=MAX_LIST_ITEMS,
        required=False,
        default=list,
    )
    documents = BoundedListField(
        child=DocumentSnapshotSerializer(), max_length=MAX_DOCUMENTS, allow_empty=True
    )

    def validate_config(self, value: dict) -> dict:
        shape = ConfigSnapshotSerializer(data=value)
        shape.is_valid(raise_exception=True)
        return {**value, **shape.validated_data}

    def validate_documents(self, value: list[dict]) -> list[dict]:
        seen: set[str] = set()
        repeated = []
        for document in value:
            if document["id"] in seen:
                repeated.append(document["id"])
            seen.add(document["id"])
        if repeated:
            raise serializers.ValidationError(
                f"document ids must be unique; repeated: {', '.join(repeated[:20])}",
                code="duplicate_document_ids",
            )
        return value


class NamespaceQuerySerializer(serializers.Serializer):
    namespace_id = serializers.CharField(max_length=64)


class ListQuerySerializer(NamespaceQuerySerializer):
    dataset_id = serializers.CharField(max_length=64, required=False)
    status = serializers.ChoiceField(
        choices=["queued", "running", "succeeded", "failed"], required=False
    )


class UpgradeDocumentSerializer(serializers.ModelSerializer):
    class Meta:
        model = UpgradeDocument
        fields = [
            "legacy_document_id",
            "name",
            "status",
            "document_id",
            "compilation_job_id",
            "last_error_code",
            "last_error_message",
        ]


class UpgradeJobSerializer(serializers.ModelSerializer):
    """The job as Dify reads it (``errors`` lists failed documents, at most 100)."""

    space_id = serializers.UUIDField(allow_null=True, read_only=True)
    namespace_id = serializers.CharField(source="tenant_id")
    # A declared field: DRF's metaclass moves it into `fields`, so `.errors` stays the property.
    errors = serializers.SerializerMethodField()  # type: ignore[assignment]

    class Meta:
        model = UpgradeJob
        fields = [
            "id",
            "namespace_id",
            "dataset_id",
            "idempotency_key",
            "status",
            "stage",
            "space_id",
            "total_documents",
            "completed_documents",
            "failed_documents",
            "attempt_count",
            "last_error_code",
            "last_error_message",
            "errors",
            "snapshot_at",
            "completed_at",
            "reconcile_completed_at",
            "created_at",
            "updated_at",
        ]

    def get_errors(self, job: UpgradeJob) -> list[dict]:
        failed = job.documents.filter(status="failed").order_by("id")[:100]
        return [
            {
                "legacy_document_id": d.legacy_document_id,
                "code": d.last_error_code,
                "message": d.last_error_message,
            }
            for d in failed
        ]
