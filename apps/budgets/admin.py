"""Admin: the limits (written through apps.budgets.services, so a raise wakes the
runs it deferred), and the usage report at `tokenlimit/usage/` — the very
selector `GET /v1/_usage` and `loomcycle usage` read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from apps.budgets import selectors, services
from apps.budgets.models import TokenLimit

MAX_DAYS = 366


@admin.register(TokenLimit)
class TokenLimitAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("scope", "tenant_id", "scope_id", "kind", "window", "soft_limit", "hard_limit", "on_exceed")
    list_filter = ("scope", "kind", "window", "on_exceed")
    search_fields = ("tenant_id", "scope_id")
    readonly_fields = ("updated_at", "updated_by", "source")

    def save_model(self, request: HttpRequest, obj: TokenLimit, form: Any, change: bool) -> None:
        spec = services.LimitSpec(
            tenant_id=obj.tenant_id,
            scope=obj.scope,
            scope_id=obj.scope_id,
            kind=obj.kind,
            window=obj.window,
            window_hours=obj.window_hours,
            soft_limit=obj.soft_limit,
            hard_limit=obj.hard_limit,
            on_exceed=obj.on_exceed,
        )
        saved = services.limit_put(spec=spec, updated_by=f"admin:{request.user.get_username()}")
        obj.pk = saved.pk

    def get_urls(self) -> list[URLPattern]:
        usage = path("usage/", self.admin_site.admin_view(self.usage_view), name="budgets_tokenlimit_usage")
        return [usage, *super().get_urls()]

    def usage_view(self, request: HttpRequest) -> HttpResponse:
        """`?by=agent,model&days=7&tenant=`: the usage report, as the API and the CLI show it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        by = [g for g in request.GET.get("by", "tenant,agent").split(",") if g]
        days = request.GET.get("days", "7")
        if not days.isdigit() or not 1 <= int(days) <= MAX_DAYS or any(g not in selectors.GROUPS for g in by):
            message = f"days must be 1..{MAX_DAYS}; by a comma-separated list of {', '.join(selectors.GROUPS)}"
            return HttpResponseBadRequest(message, content_type="text/plain")
        now = timezone.now()
        tenant = request.GET.get("tenant") or None
        rows = selectors.usage_report(tenant_id=tenant, group_by=by, since=now - timedelta(days=int(days)), until=now)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Usage",
            "by": by,
            "by_text": ",".join(by),
            "days": days,
            "rows": [r.as_dict() | {"keys": [r.key[g] for g in by]} for r in rows],
            "total": selectors.usage_totals(rows),
        }
        return TemplateResponse(request, "admin/budgets/usage.html", context)
