"""Read-only admin for the gateway's audit trail and the usage ledger: rows
are written by the gateway and the engine only, never edited by hand. The
ledger's page also has a usage view (`usage/`): tokens and cost per day by
tenant and by model, drawn as inline SVG on the server."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from apps.core.admin import ReadOnlyAdmin
from apps.core.numbers import parse_count
from apps.gateway.models import GatewayCall, UsageEntry
from apps.gateway.usage_report import MAX_DAYS, usage_report

DEFAULT_DAYS = 14


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

    def get_urls(self) -> list[URLPattern]:
        usage = path("usage/", self.admin_site.admin_view(self.usage_view), name="gateway_usageentry_usage")
        return [usage, *super().get_urls()]

    def usage_view(self, request: HttpRequest) -> HttpResponse:
        """Tokens and cost per UTC day by tenant and by model (`?days=`, 1..MAX_DAYS)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        raw = request.GET.get("days", str(DEFAULT_DAYS))
        days = parse_count(raw)
        if days is None or not 1 <= days <= MAX_DAYS:
            message = f"days must be a whole number from 1 to {MAX_DAYS}"
            return HttpResponseBadRequest(message, content_type="text/plain")
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Usage per day",
            "days": days,
            "max_days": MAX_DAYS,
            "report": usage_report(days=days),
        }
        return TemplateResponse(request, "admin/gateway/usage.html", context)
