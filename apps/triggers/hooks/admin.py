"""Django admin of tool-use hook registrations: list and read them in chain order; delete them only
through the service (`hook_delete`, which also invalidates every process's cached chain).
Registering stays on `POST /v1/hooks`, which checks the callback URL against the egress policy."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core.admin import ReadOnlyAdmin
from apps.core.types import Principal
from apps.triggers.hooks.models import HookRegistration
from apps.triggers.hooks.services import hook_delete

ADMIN_SCOPE = "substrate:admin"


@admin.register(HookRegistration)
class HookRegistrationAdmin(ReadOnlyAdmin):
    list_display = ("hook_id", "name", "phase", "tenant_id", "owner", "fail_mode", "timeout_ms", "created_at")
    list_filter = ("phase", "tenant_id", "fail_mode")
    search_fields = ("hook_id", "name", "owner", "tenant_id")
    ordering = ("seq",)  # the chain order
    fields = (
        "hook_id",
        "name",
        "phase",
        "tenant_id",
        "owner",
        "agents",
        "tools",
        "callback_url",
        "fail_mode",
        "timeout_ms",
        "created_at",
        "updated_at",
    )
    actions = ("delete_hooks",)

    def has_service_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("triggers.delete_hookregistration"))

    @admin.action(description="Delete the selected hooks (hook service)", permissions=["service"])
    def delete_hooks(self, request: HttpRequest, queryset: QuerySet[HookRegistration]) -> None:
        who = Principal(tenant_id="", subject=f"admin:{request.user.get_username()}", scopes=frozenset({ADMIN_SCOPE}))
        ids = list(queryset.values_list("hook_id", flat=True))
        for hook_id in ids:
            hook_delete(principal=who, hook_id=hook_id)
        self.message_user(request, f"deleted {len(ids)} hook(s)")
