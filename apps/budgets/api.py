"""`/v1/_limits` (GET, PUT, DELETE; loomcycle's shape plus kind, window and
on_exceed) and `GET /v1/_usage` (JSON or CSV). The scope gate (SPEC 2.1) puts
both behind substrate:tenant, writes not member-accessible; apps.budgets.authz
confines a tenant to its own rows."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, Router, Schema

from apps.budgets import authz, selectors, services
from apps.budgets.models import Kind, OnExceed, Window
from apps.core.http import db_call, request_principal

router = Router(tags=["budgets"])


class LimitPutIn(Schema):
    tenant_id: str | None = None
    scope: str
    scope_id: str = ""
    kind: str = Kind.TOKENS.value
    window: str = Window.MONTH.value
    window_hours: int = 0
    soft_limit: Decimal | None = None
    hard_limit: Decimal | None = None
    on_exceed: str = OnExceed.REFUSE.value


class LimitOut(Schema):
    tenant_id: str
    scope: str  # operator | tenant | user | agent
    scope_id: str
    kind: str  # tokens | input_tokens | output_tokens | cost_usd
    window: str  # month | day | hours
    window_hours: int
    soft_limit: int | float | None
    hard_limit: int | float | None
    on_exceed: str  # refuse | defer
    used: int | float | None  # spent (and held) in the current window
    resets_at: str
    updated_at: str
    updated_by: str


class LimitsOut(Schema):
    limits: list[LimitOut]


class LimitsDeletedOut(Schema):
    deleted: int


class UsageOut(Schema):
    """JSON form of GET /v1/_usage (`?format=csv` answers text/csv with the same columns).
    Each group holds its `group_by` keys, the token sums, `calls`, `cost_usd`, `unpriced_calls`
    and `cost` ("unpriced" when none of its calls had a price)."""

    model_config = {"extra": "allow"}

    from_: str = Field(alias="from")
    to: str
    group_by: list[str]
    groups: list[dict[str, Any]]
    total: dict[str, Any]


def limit_out(view: selectors.LimitView) -> dict[str, Any]:
    row = view.row

    def num(v: Decimal | None) -> int | float | None:
        return None if v is None else (int(v) if v == v.to_integral_value() else float(v))

    return {
        "tenant_id": row.tenant_id,
        "scope": row.scope,
        "scope_id": row.scope_id,
        "kind": row.kind,
        "window": row.window,
        "window_hours": row.window_hours,
        "soft_limit": num(row.soft_limit),
        "hard_limit": num(row.hard_limit),
        "on_exceed": row.on_exceed,
        "used": num(view.used),
        "resets_at": view.resets_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "updated_by": row.updated_by,
    }


@router.get(
    "/_limits", response=LimitsOut, operation_id="limits_list", summary="Token and cost budgets, with use this window"
)
async def limits_list(request: HttpRequest) -> JsonResponse:
    tenant = authz.read_tenant(request_principal(request), request.GET.get("tenant"))
    views = await db_call(selectors.limits_list)(tenant_id=tenant)
    return JsonResponse({"limits": [limit_out(v) for v in views]})


@router.put("/_limits", response=LimitsOut, operation_id="limits_put", summary="Create or replace one budget")
async def limits_put(request: HttpRequest, body: LimitPutIn) -> JsonResponse:
    principal = request_principal(request)
    tenant = authz.write_tenant(principal, body.scope, body.tenant_id)
    spec = services.LimitSpec(**{**body.dict(), "tenant_id": tenant})
    row = await db_call(services.limit_put)(spec=spec, updated_by=principal.subject)
    views = await db_call(selectors.limits_list)(tenant_id=row.tenant_id)
    return JsonResponse({"limits": [limit_out(v) for v in views if v.row.id == row.id]})


@router.delete(
    "/_limits",
    response=LimitsDeletedOut,
    operation_id="limits_delete",
    summary="Remove budgets: that scope is unlimited again",
)
async def limits_delete(request: HttpRequest) -> JsonResponse:
    q = request.GET
    scope = q.get("scope", "")
    tenant = authz.write_tenant(request_principal(request), scope, q.get("tenant") or q.get("tenant_id"))
    spec = services.LimitSpec(tenant_id=tenant, scope=scope, scope_id=q.get("scope_id", ""))
    services.limit_check(spec)
    deleted = await db_call(services.limit_delete)(
        tenant_id=tenant, scope=scope, scope_id=spec.scope_id, kind=q.get("kind"), window=q.get("window")
    )
    return JsonResponse({"deleted": deleted})


@router.get(
    "/_usage",
    response=UsageOut,
    by_alias=True,  # the schema names `from` as the body does, not the attribute `from_`
    operation_id="usage_report",
    summary="Tokens, calls and cost, grouped; JSON or CSV",
)
async def usage(request: HttpRequest) -> HttpResponse:
    q = request.GET
    tenant = authz.read_tenant(request_principal(request), q.get("tenant"))
    group_by = selectors.usage_groups([g for g in (q.get("group_by") or "tenant").split(",") if g])
    since, until = selectors.usage_range(q.get("from"), q.get("to"))
    rows = await db_call(selectors.usage_report)(tenant_id=tenant, group_by=group_by, since=since, until=until)
    if q.get("format") == "csv":
        return _csv(group_by, rows)
    return JsonResponse(
        {
            "from": since.isoformat(),
            "to": until.isoformat(),
            "group_by": group_by,
            "groups": [r.as_dict() for r in rows],
            "total": selectors.usage_totals(rows),
        }
    )


def _csv(group_by: list[str], rows: list[selectors.UsageGroupRow]) -> HttpResponse:
    buf = io.StringIO()
    out = [r.as_dict() for r in rows]
    fields = [*group_by, *selectors.TOKENS, "calls", "cost_usd", "unpriced_calls", "cost"]
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(out)
    return HttpResponse(buf.getvalue(), content_type="text/csv; charset=utf-8")
