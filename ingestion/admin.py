from __future__ import annotations

from django.contrib import admin

from .models import CompilationJob, Document, KnowledgeNode, ParseArtifact


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = (
        "filename",
        "space",
        "state",
        "error_code",
        "node_count",
        "size_bytes",
        "created_at",
    )
    list_filter = ("state", "mime_type")
    list_select_related = ("space",)
    search_fields = ("filename", "sha256", "=id")
    raw_id_fields = ("space",)
    readonly_fields = [f.name for f in Document._meta.fields]
    show_full_result_count = False


@admin.register(CompilationJob)
class CompilationJobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "document",
        "stage",
        "run_state",
        "progress_percent",
        "error_code",
        "execution_attempts",
        "updated_at",
    )
    list_filter = ("run_state", "stage")
    list_select_related = ("document",)
    search_fields = ("=id", "document__filename", "task_id")
    raw_id_fields = ("space", "document")
    readonly_fields = [f.name for f in CompilationJob._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ParseArtifact)
class ParseArtifactAdmin(admin.ModelAdmin):
    list_display = ("id", "document", "parser", "page_count", "created_at")
    raw_id_fields = ("job", "document")
    readonly_fields = (
        "id",
        "job",
        "document",
        "parser",
        "artifact_hash",
        "page_count",
        "pages_without_text",
        "created_at",
    )
    exclude = ("elements",)

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(KnowledgeNode)
class KnowledgeNodeAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "document",
        "chunk_index",
        "kind",
        "page_number",
        "start_offset",
        "end_offset",
    )
    list_select_related = ("document",)
    raw_id_fields = ("space", "document")
    search_fields = ("=id", "document__filename")
    readonly_fields = [f.name for f in KnowledgeNode._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False
