"""Django admin for memory rows: list, search and read them; change them only through the memory
service (apps.memory.services), whose checks (value size, quota, embedding) an edit form would skip.
Actions: delete the selected keys (`memory_delete`), re-embed them (`memory_set` with embed).
The embedding is shown as present or absent, never edited by hand (a stale vector would mislead search)."""

from __future__ import annotations

import math

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import ApplicationError
from apps.memory.models import MemoryEntry
from apps.memory.services import Slot, memory_delete, memory_set


def _slot(row: MemoryEntry) -> Slot:
    return Slot(tenant_id=row.tenant_id, scope=row.scope, scope_id=row.scope_id)


def _ttl_left(row: MemoryEntry) -> int | None:
    """The row's remaining life in whole seconds (None: it never expires; 0: it already has)."""
    if row.expires_at is None:
        return None
    return max(0, math.ceil((row.expires_at - timezone.now()).total_seconds()))


@admin.register(MemoryEntry)
class MemoryEntryAdmin(ReadOnlyAdmin):
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
    actions = ("delete_keys", "reembed_keys")

    def has_service_permission(self, request: HttpRequest) -> bool:
        """The actions write through the service: Django's delete permission on the rows grants them."""
        return bool(request.user.has_perm("memory.delete_memoryentry"))

    @admin.display(boolean=True, description="embedded")
    def is_embedded(self, obj: MemoryEntry) -> bool:
        return obj.embedding is not None

    @admin.action(description="Delete the selected keys (memory service)", permissions=["service"])
    def delete_keys(self, request: HttpRequest, queryset: QuerySet[MemoryEntry]) -> None:
        deleted = sum(memory_delete(slot=_slot(row), key=row.key) for row in queryset)
        self.message_user(request, f"deleted {deleted} live key(s)")

    @admin.action(description="Re-embed the selected keys (memory service)", permissions=["service"])
    def reembed_keys(self, request: HttpRequest, queryset: QuerySet[MemoryEntry]) -> None:
        done, warnings = 0, []
        for row in queryset:
            ttl = _ttl_left(row)
            if ttl == 0:
                warnings.append(f"{row.key}: expired, not re-embedded")
                continue
            try:  # the same value and expiry, now with a fresh vector
                result = memory_set(slot=_slot(row), key=row.key, value=row.value, embed=True, ttl_seconds=ttl)
            except ApplicationError as exc:
                warnings.append(f"{row.key}: {exc.code}: {exc.message}")
                continue
            done += result.embedded
            if result.embed_warning:
                warnings.append(f"{row.key}: {result.embed_warning}")
        self.message_user(request, f"re-embedded {done} key(s)")
        for warning in warnings:
            self.message_user(request, warning, level=messages.WARNING)
