from __future__ import annotations

from django.contrib import admin

from .models import IdempotencyRecord


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = ("key", "owner", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("key", "owner")
    readonly_fields = ("owner", "key", "fingerprint", "status", "body", "created_at")
    show_full_result_count = False

    def has_add_permission(self, request) -> bool:
        return False
