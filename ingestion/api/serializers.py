"""REST serializers of documents and compilation jobs (the job's public state comes from
:func:`ingestion.reports.public_state`)."""

from __future__ import annotations

from rest_framework import serializers

from ingestion.models import CompilationJob, Document
from ingestion.reports import public_state


class JobSerializer(serializers.ModelSerializer):
    document_id = serializers.UUIDField(read_only=True)
    space_id = serializers.UUIDField(read_only=True)
    retry_of = serializers.UUIDField(source="retry_of_id", read_only=True)
    state = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()

    def get_state(self, job: CompilationJob) -> str:
        return public_state(job)

    def get_progress(self, job: CompilationJob) -> dict:
        progress = {
            "phase": job.stage,
            "operation": "",
            "elements_parsed": None,
            "nodes_total": None,
            "nodes_embedded": None,
            "percent": job.progress_percent,
        }
        progress.update(job.progress or {})
        return progress

    class Meta:
        model = CompilationJob
        fields = [
            "id",
            "space_id",
            "document_id",
            "state",
            "stage",
            "run_state",
            "progress",
            "progress_percent",
            "attempt_number",
            "retry_of",
            "execution_attempts",
            "error_code",
            "error_message",
            "error_retryable",
            "next_attempt_at",
            "lease_expires_at",
            "heartbeat_at",
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
            "enabled",
            "row_version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
