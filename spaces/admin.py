from __future__ import annotations

from django.contrib import admin, messages
from django.utils import timezone

from .models import ApiKey, KnowledgeSpace, PublicationHead
from .services import revoke_api_key


@admin.register(KnowledgeSpace)
class KnowledgeSpaceAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "tenant_id", "embedding_model_id", "revision", "created_at")
    list_filter = ("tenant_id",)
    search_fields = ("name", "slug", "tenant_id", "=id")
    readonly_fields = (
        "id",
        "revision",
        "embedding_model_id",
        "embedding_dimension",
        "created_at",
        "updated_at",
    )
    show_full_result_count = False


@admin.register(PublicationHead)
class PublicationHeadAdmin(admin.ModelAdmin):
    list_display = ("space", "revision", "published_at")
    list_select_related = ("space",)
    readonly_fields = ("space", "revision", "published_at")

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "tenant_id", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant_id", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("prefix", "tenant_id", "name")
    readonly_fields = ("id", "prefix", "key_hash", "created_at", "last_used_at", "revoked_at")
    filter_horizontal = ("spaces",)
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # keys are created with 'kfs apikey create' so the secret is shown once

    @admin.action(description="Revoke selected API keys (immediately)")
    def revoke(self, request, queryset) -> None:
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            revoke_api_key(key.prefix)
            count += 1
        self.message_user(
            request, f"Revoked {count} API keys at {timezone.now():%H:%M:%S} UTC.", messages.SUCCESS
        )
