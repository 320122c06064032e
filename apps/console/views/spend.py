"""Spend: tokens and cost per day by agent and model, as charts, and the budgets with their
remaining fraction. The figures are the usage report's and the limits' (apps.budgets.selectors,
what GET /v1/_usage and GET /v1/_limits answer), for the tenant apps.budgets.authz gives
this principal (the operator: every tenant, or the one `tenant` names)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from apps.budgets import authz, selectors
from apps.console.pages import console_view, render_page
from apps.console.spend import budget_of, cost_of, per_day, tokens_of
from apps.core.types import Principal


@console_view(rest="GET /v1/_usage")
def spend(request: HttpRequest, principal: Principal) -> HttpResponse:
    q = request.GET
    tenant = authz.read_tenant(principal, q.get("tenant") or None)
    since, until = selectors.usage_range(q.get("from") or None, q.get("to") or None)
    by_agent = selectors.usage_report(tenant_id=tenant, group_by=["day", "agent"], since=since, until=until)
    by_model = selectors.usage_report(tenant_id=tenant, group_by=["day", "model"], since=since, until=until)
    agent_rows = [r.as_dict() for r in by_agent]
    ctx = {
        "since": since,
        "until": until,
        "query": {k: q.get(k, "") for k in ("from", "to", "tenant")},
        "full_authority": authz.full_authority(principal),
        "tokens_chart": per_day(agent_rows, "agent", tokens_of),
        "cost_chart": per_day([r.as_dict() for r in by_model], "model", cost_of),
        "total": selectors.usage_totals(by_agent),
        "groups": agent_rows,
        "budgets": [budget_of(v) for v in selectors.limits_list(tenant_id=tenant)],
    }
    return render_page(request, principal, "console/spend/index.html", ctx)
