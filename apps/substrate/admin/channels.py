"""Declared channels (SPEC 9.4). Yaml rows are ground truth: view-only here.

Runtime rows are edited as plain rows until the channels issue brings a
channel service to route these writes through."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.substrate.admin.common import TenantColumn, TenantFilter
from apps.substrate.models import ChannelDef, DefSource


@admin.register(ChannelDef)
class ChannelDefAdmin(TenantColumn, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "tenant", "scope", "semantic", "publisher", "default_ttl_seconds", "max_messages", "source")
    list_filter = (TenantFilter, "source", "scope")
    search_fields = ("name", "description")
    readonly_fields = ("source", "created_at", "updated_at")
    actions = None  # bulk delete would not spare the yaml rows

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.source == DefSource.YAML:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.source == DefSource.YAML:
            return False
        return super().has_delete_permission(request, obj)
