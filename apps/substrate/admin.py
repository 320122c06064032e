from django.contrib import admin

from apps.substrate.models import AgentDef, AgentDefActive


@admin.register(AgentDef)
class AgentDefAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "version", "tenant_id", "source", "retired", "content_sha256", "created_at")
    list_filter = ("source", "retired", "tenant_id")
    search_fields = ("name", "id", "content_sha256")
    readonly_fields = ("id", "content_sha256", "created_at", "parent")


@admin.register(AgentDefActive)
class AgentDefActiveAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "tenant_id", "active_def", "promoted_at")
