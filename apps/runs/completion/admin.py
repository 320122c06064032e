"""Django admin of completion-webhook deliveries (read-only): what was sent where, how often, and
the receiver's last answer. Registered on import by apps.runs.admin."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.runs.completion.models import RunWebhookDelivery


@admin.register(RunWebhookDelivery)
class RunWebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "run_id",
        "tenant_id",
        "event",
        "state",
        "attempts",
        "last_status",
        "created_at",
        "delivered_at",
    )
    list_filter = ("state", "event", "tenant_id")
    search_fields = ("id", "run__id", "url")
    ordering = ("-created_at",)
