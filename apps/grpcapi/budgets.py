"""Budget RPCs: TokenLimit (op list / set / delete, the twin of GET / PUT / DELETE
/v1/_limits) and UsageReport (GET /v1/_usage), through the same services, selectors and
tenant rule (apps.budgets.authz) as the HTTP routes.

The wire carries loomcycle's limit (scope, scope_id, soft and hard tokens): TokenLimit acts on
the limits of that shape here, total tokens over the calendar month. A set keeps an existing
row's on_exceed (a deferring limit stays deferring); limits of another kind or window are
listed, written and removed through /v1/_limits only (docs/compat.md). UsageReport groups by
the columns its rows carry (tenant, user, provider, model); agent and day are REST-only."""

from __future__ import annotations

from decimal import Decimal

from apps.budgets import authz, selectors, services
from apps.budgets.models import Kind, OnExceed, TokenLimit, Window
from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.types import Principal
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import unary

LIMIT_ROUTES = {"list": "GET", "set": "PUT", "delete": "DELETE"}
USAGE_GROUPS = ("tenant", "user", "provider", "model")


def _limit_route(request: pb.TokenLimitRequest) -> tuple[str, str]:
    """A write takes the write scope (not member-accessible); an unknown op is refused after auth."""
    return (LIMIT_ROUTES.get(request.op, "PUT"), "/v1/_limits")


def _loomcycle_shaped(row: TokenLimit) -> bool:
    return row.kind == Kind.TOKENS and row.window == Window.MONTH


def _entry(view: selectors.LimitView) -> pb.TokenLimitEntry:
    row = view.row
    entry = pb.TokenLimitEntry(
        tenant_id=row.tenant_id,
        scope=row.scope,
        scope_id=row.scope_id,
        used=int(view.used),
        updated_at=row.updated_at.isoformat(),
        updated_by=row.updated_by,
    )
    if row.soft_limit is not None:
        entry.soft_limit = int(row.soft_limit)
    if row.hard_limit is not None:
        entry.hard_limit = int(row.hard_limit)
    return entry


def _entries(tenant: str | None, only_id: int | None = None) -> list[pb.TokenLimitEntry]:
    views = selectors.limits_list(tenant_id=tenant)
    return [_entry(v) for v in views if _loomcycle_shaped(v.row) and (only_id is None or v.row.id == only_id)]


def _set(principal: Principal, request: pb.TokenLimitRequest) -> list[pb.TokenLimitEntry]:
    tenant = authz.write_tenant(principal, request.scope, request.tenant)
    kept = selectors.limit_find(tenant_id=tenant, scope=request.scope, scope_id=request.scope_id)
    spec = services.LimitSpec(
        tenant_id=tenant,
        scope=request.scope,
        scope_id=request.scope_id,
        soft_limit=Decimal(request.soft_limit) if request.HasField("soft_limit") else None,
        hard_limit=Decimal(request.hard_limit) if request.HasField("hard_limit") else None,
        on_exceed=kept.on_exceed if kept is not None else OnExceed.REFUSE,
    )
    row = services.limit_put(spec=spec, updated_by=principal.subject)
    return _entries(row.tenant_id, only_id=row.id)


def _delete(principal: Principal, request: pb.TokenLimitRequest) -> None:
    tenant = authz.write_tenant(principal, request.scope, request.tenant)
    services.limit_check(services.LimitSpec(tenant_id=tenant, scope=request.scope, scope_id=request.scope_id))
    services.limit_delete(
        tenant_id=tenant, scope=request.scope, scope_id=request.scope_id, kind=Kind.TOKENS, window=Window.MONTH
    )


def _token_limit(principal: Principal, request: pb.TokenLimitRequest) -> pb.TokenLimitResponse:
    if request.op == "list":
        return pb.TokenLimitResponse(limits=_entries(authz.read_tenant(principal, request.tenant)))
    if request.op == "set":
        return pb.TokenLimitResponse(limits=_set(principal, request))
    if request.op == "delete":
        _delete(principal, request)
        return pb.TokenLimitResponse()
    raise Invalid(f"op must be one of: list, set, delete (got {request.op[:40]!r})", code="invalid_op")


def _aggregate(row: selectors.UsageGroupRow) -> pb.UsageAggregate:
    key = row.key
    return pb.UsageAggregate(
        tenant_id=key.get("tenant", ""),
        user_id=key.get("user", ""),
        provider=key.get("provider", ""),
        model=key.get("model", ""),
        input_tokens=row.sums["input_tokens"],
        output_tokens=row.sums["output_tokens"],
        cache_creation_tokens=row.sums["cache_creation_input_tokens"],
        cache_read_tokens=row.sums["cache_read_input_tokens"],
        cost=float(row.cost),
        currency="USD",
        call_count=row.calls,
        unpriced_calls=row.calls - row.priced,
    )


def _usage(principal: Principal, request: pb.UsageReportRequest) -> pb.UsageReportResponse:
    tenant = authz.read_tenant(principal, request.tenant)
    group_by = selectors.usage_groups(list(request.group_by) or ["tenant"], USAGE_GROUPS)
    since, until = selectors.usage_range(request.from_time, request.to_time)
    rows = selectors.usage_report(tenant_id=tenant, group_by=group_by, since=since, until=until)
    return pb.UsageReportResponse(group_by=group_by, rows=[_aggregate(r) for r in rows])


class BudgetRpcs:
    @unary(_limit_route)
    async def TokenLimit(self, request: pb.TokenLimitRequest, principal: Principal) -> pb.TokenLimitResponse:
        return await db_call(_token_limit)(principal, request)

    @unary(("GET", "/v1/_usage"))
    async def UsageReport(self, request: pb.UsageReportRequest, principal: Principal) -> pb.UsageReportResponse:
        return await db_call(_usage)(principal, request)
