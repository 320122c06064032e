"""Substrate op-dispatch routes (SPEC 2.5): `POST /v1/_<kind>def` with the
def tool's input as the body, and `GET /v1/_<kind>def/names`.

The operator plane runs ops with the caller principal's tenant, no tool
ceiling and every name scope. 200 carries the tool's JSON; a refused op is
422 `{"code":"tool_refused","error":<text>,"tool":"<ToolName>"}`, and an
unknown (or another tenant's) def_id is 404 `not_found`.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.errors import ApplicationError
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.types import Principal
from apps.substrate import selectors, services
from apps.substrate.kinds import KINDS, REFUSALS, Kind, Refusal, refusal_details
from apps.substrate.schemas import DefNamesOut, DefOpIn, DefOpOut

router = Router(tags=["substrate"])
ADMIN_BODY_BYTES = 1024 * 1024


class ToolError(ApplicationError):
    """A def tool's refusal over HTTP, naming the tool: 422 `tool_refused` (or a
    refusal's own code: `schedule_too_frequent`, `max_concurrent_children_over_cap`),
    404 `not_found` for an unknown (or another tenant's) def_id, 429
    `tenant_quota_exceeded` past a per-tenant count (apps.substrate.quotas)."""

    def __init__(self, exc: Refusal, tool: str) -> None:
        super().__init__(exc.message, code=exc.code, details=refusal_details(exc))
        self.status = exc.status
        self.tool = tool

    def body(self) -> dict[str, Any]:
        return {**super().body(), "tool": self.tool}


async def run_op(kind: Kind, principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    """The op through the service's one async entry (which decides what holds a thread)."""
    try:
        return await services.def_dispatch_async(kind, services.operator_author(principal), data)
    except REFUSALS as exc:
        raise ToolError(exc, kind.tool) from exc


def _names(kind: Kind, principal: Principal) -> list[dict[str, Any]]:
    try:
        return selectors.def_names(kind, tenant_id=principal.read_tenant)
    finally:
        connection.close()


def _add_routes(kind: Kind) -> None:
    async def op_dispatch(request: HttpRequest) -> JsonResponse:
        data = parse_body(request, DefOpIn, max_bytes=ADMIN_BODY_BYTES).model_dump(exclude_unset=True)
        principal = request_principal(request)
        return JsonResponse(await run_op(kind, principal, data))

    async def names(request: HttpRequest) -> JsonResponse:
        principal = request_principal(request)
        return JsonResponse({"names": await sync_to_async(_names, thread_sensitive=False)(kind, principal)})

    router.add_api_operation(
        f"/_{kind.key}def",
        ["POST"],
        op_dispatch,
        operation_id=f"{kind.key}def_op",
        response=DefOpOut,
        summary=f"{kind.tool} op-dispatch ({', '.join(sorted(kind.ops))})",
        openapi_extra=openapi_body(DefOpIn, enums={"op": sorted(kind.ops)}),
    )
    router.add_api_operation(
        f"/_{kind.key}def/names",
        ["GET"],
        names,
        operation_id=f"{kind.key}def_names",
        response=DefNamesOut,
        summary=f"{kind.tool} names with version counts and the active version",
    )


def mount() -> Router:
    """Routes for every registered kind (kinds register at import)."""
    for kind in KINDS.values():
        _add_routes(kind)
    return router
