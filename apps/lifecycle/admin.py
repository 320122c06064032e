"""Admin: erasure audit rows (read-only: written by an erasure only), retention ages and
no-trace overrides."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.lifecycle.models import Erasure, RetentionOverride, RetentionPolicy


@admin.register(Erasure)
class ErasureAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant_id", "user_id", "status", "requested_by", "started_at", "finished_at")
    list_filter = ("status",)
    search_fields = ("tenant_id", "user_id")


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("tenant_id", "agent_name", "max_age_days", "updated_by", "updated_at")


@admin.register(RetentionOverride)
class RetentionOverrideAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("tenant_id", "agent_name", "until", "set_by", "created_at")
