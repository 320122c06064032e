"""Read-only admin for the gateway's audit trail and the usage ledger: rows
are written by the gateway and the engine only, never edited by hand."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.gateway.models import GatewayCall, UsageEntry


@admin.register(GatewayCall)
class GatewayCallAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "request_id",
        "endpoint",
        "tenant_id",
        "user_id",
        "provider",
        "model",
        "stream",
        "status_code",
        "error_code",
        "latency_ms",
        "input_tokens",
        "output_tokens",
    )
    list_filter = ("endpoint", "status_code", "provider", "stream")
    search_fields = ("=request_id", "tenant_id", "user_id", "subject", "model")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False  # the table is large; no COUNT(*) per page


@admin.register(UsageEntry)
class UsageEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "source",
        "tenant_id",
        "user_id",
        "run_id",
        "step",
        "provider",
        "model",
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cost_usd",
    )
    list_filter = ("source", "provider")
    search_fields = ("=run_id", "tenant_id", "user_id", "model")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
