"""Delivery records in the Django admin: read-only, filtered by verdict, to
triage rejected deliveries (bad signatures, unresolvable secrets, mapping)."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.triggers.webhooks.models import WebhookDelivery


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "webhook_name", "tenant_id", "verdict", "delivery_id", "run_id", "channel", "detail")
    list_filter = ("verdict", "webhook_name")
    search_fields = ("delivery_id", "webhook_name", "run_id", "detail")
    date_hierarchy = "received_at"
    ordering = ("-received_at",)
