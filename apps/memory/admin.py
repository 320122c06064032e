"""Django admin for memory rows: list, search, edit the JSON value and the
expiry. The embedding is shown as present or absent, never edited by hand
(a stale vector would mislead search): re-set the key with embed to refresh it."""

from __future__ import annotations

from django.contrib import admin

from apps.memory.models import MemoryEntry


@admin.register(MemoryEntry)
class MemoryEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("key", "scope", "scope_id", "tenant_id", "expires_at", "is_embedded", "updated_at")
    list_filter = ("scope", "tenant_id")
    search_fields = ("key", "scope_id", "tenant_id")
    ordering = ("tenant_id", "scope", "scope_id", "key")
    fields = (
        "tenant_id",
        "scope",
        "scope_id",
        "key",
        "value",
        "expires_at",
        "embedding_provider",
        "embedding_model",
        "created_at",
        "updated_at",
    )
    readonly_fields = ("embedding_provider", "embedding_model", "created_at", "updated_at")

    @admin.display(boolean=True, description="embedded")
    def is_embedded(self, obj: MemoryEntry) -> bool:
        return obj.embedding is not None
