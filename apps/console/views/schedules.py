"""Schedules and webhooks: each schedule's next fire times and recent fires (the state REST's
GET /v1/_schedules/* answers, apps.triggers.services and selectors), and each webhook's recent
deliveries with their verdicts (GET /v1/_webhooks/{name}/recent-deliveries's selector: like that
route, operator-only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse

from apps.console.pages import console_view, render_page
from apps.console.visibility import rest_allows
from apps.core.types import Principal
from apps.substrate import selectors as defs
from apps.substrate.kinds import get_kind
from apps.triggers import presenters, selectors, services
from apps.triggers.cron import cron_of, next_after
from apps.triggers.webhooks import selectors as webhooks

UPCOMING = 5
RECENT = 50


def upcoming(definition: dict[str, Any], first: str | None, n: int = UPCOMING) -> list[datetime]:
    """The next `n` fire times: the state's next one, then the cron's slots after it."""
    if not first:
        return []
    times = [datetime.fromisoformat(first.replace("Z", "+00:00"))]
    expr, tz = cron_of(definition), str(definition.get("timezone") or "UTC")
    while len(times) < n:
        after = next_after(expr, tz, times[-1])
        if after is None:
            break
        times.append(after)
    return times


@console_view(rest="GET /v1/_schedules/list-all")
def schedules(request: HttpRequest, principal: Principal) -> HttpResponse:
    entries = services.schedules_list(principal=principal, tenant=request.GET.get("tenant") or None)["entries"]
    return render_page(request, principal, "console/schedules/list.html", {"entries": entries})


@console_view(rest="GET /v1/_schedules/{def_id}/state")
def schedule(request: HttpRequest, principal: Principal, def_id: str) -> HttpResponse:
    state = services.schedule_state(principal=principal, def_id=def_id)  # another tenant's: 404
    row = selectors.schedule_def_get(tenant_id=principal.read_tenant, def_id=def_id)
    ctx = {
        "state": state,
        "definition": row.definition,
        "upcoming": upcoming(row.definition, state["next_run_at"]) if not state["paused_until"] else [],
        "fires": [presenters.fire_out(f) for f in selectors.schedule_fires(def_id=def_id, limit=RECENT)],
    }
    return render_page(request, principal, "console/schedules/schedule.html", ctx)


@console_view(rest="GET /v1/_webhookdef/names")
def webhooks_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    names = defs.def_names(get_kind("webhook"), tenant_id=principal.read_tenant)
    can_see = rest_allows("GET /v1/_webhooks/-/recent-deliveries")(principal)
    return render_page(request, principal, "console/schedules/webhooks.html", {"names": names, "can_see": can_see})


@console_view(rest="GET /v1/_webhooks/{name}/recent-deliveries")
def webhook_deliveries(request: HttpRequest, principal: Principal, name: str) -> HttpResponse:
    rows = webhooks.recent_deliveries(name=name, tenant_id=principal.read_tenant, limit=RECENT)
    return render_page(request, principal, "console/schedules/deliveries.html", {"name": name, "rows": rows})
