from __future__ import annotations

from rest_framework import serializers

from .models import CompilationJob, Document


class JobSerializer(serializers.ModelSerializer):
    document_id = serializers.UUIDField(read_only=True)
    space_id = serializers.UUIDField(read_only=True)

    class Meta:
        model = CompilationJob
        fields = [
            "id",
            "space_id",
            "document_id",
            "stage",
            "run_state",
            "progress_percent",
            "execution_attempts",
            "error_code",
            "error_message",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
        ]
        read_only_fields = fields


class DocumentSerializer(serializers.ModelSerializer):
    space_id = serializers.UUIDField(read_only=True)
    nodes = serializers.IntegerField(source="node_count", read_only=True)

    class Meta:
        model = Document
        fields = [
            "id",
            "space_id",
            "filename",
            "mime_type",
            "size_bytes",
            "sha256",
            "state",
            "error_code",
            "error_message",
            "nodes",
            "metadata",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
