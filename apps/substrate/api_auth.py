"""Who am I, and the operator-token op-dispatch (SPEC 2.2 `/v1/_me`, 2.5 `/v1/_operatortokendef`).

The scope gate in `auth.BearerAuth` already limits `/v1/_operatortokendef`
to substrate:admin; a refused op is 422 `tool_refused` with
`"tool":"OperatorTokenDef"`, as for the def routes.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from ninja import Router
from pydantic import BaseModel, ConfigDict

from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.types import Principal
from apps.substrate import tokens
from apps.substrate.api import ADMIN_BODY_BYTES, ToolError
from apps.substrate.kinds import Refused
from apps.substrate.schemas import DefNamesOut, DefOpOut

router = Router(tags=["auth"])


class OperatorTokenOpIn(BaseModel):
    """The OperatorTokenDef tool's input; each op reads what it needs."""

    model_config = ConfigDict(extra="forbid")

    op: str
    name: Any = None
    def_id: Any = None
    tenant_id: Any = None
    subject: Any = None
    scopes: Any = None
    import_token: Any = None
    grace_seconds: Any = None


class CapabilitiesOut(BaseModel):
    mcp_allow_dynamic_stdio: bool
    http_host_allowlist_configured: bool


class MeOut(BaseModel):
    tenant_id: str
    subject: str
    scopes: list[str]
    is_admin: bool
    legacy: bool
    capabilities: CapabilitiesOut
    open_mode: bool | None = None


@router.get("/_me", summary="The calling principal (tenant, subject, scopes)", response=MeOut, exclude_none=True)
def me(request: HttpRequest) -> dict[str, Any]:
    principal = request_principal(request)
    out: dict[str, Any] = {
        "tenant_id": principal.tenant_id,
        "subject": principal.subject,
        "scopes": sorted(principal.scopes),
        "is_admin": principal.is_admin,
        "legacy": principal.legacy,
        # Booleans only: never the allowlist's entries (internal host names).
        "capabilities": {
            "mcp_allow_dynamic_stdio": False,
            "http_host_allowlist_configured": bool(settings.LOOMCYCLE.http_host_allowlist),
        },
    }
    if principal.open_mode:
        out["open_mode"] = True
    return out


def _run_op(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    try:
        return tokens.token_dispatch(data, by=principal.subject)
    except Refused as exc:
        raise ToolError(exc, tokens.TOOL) from exc
    finally:
        connection.close()


def _names() -> list[dict[str, Any]]:
    try:
        return tokens.token_names()
    finally:
        connection.close()


@router.get(
    "/_operatortokendef/names",
    response=DefNamesOut,
    summary="Operator token names with live and total counts; admin only",
)
async def operator_token_names(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"names": await sync_to_async(_names, thread_sensitive=False)()})


@router.post(
    "/_operatortokendef",
    response=DefOpOut,
    summary="OperatorTokenDef op-dispatch (create, rotate, retire, get, list); admin only",
    openapi_extra=openapi_body(OperatorTokenOpIn, enums={"op": tokens.OPS}),
)
async def operator_token_op(request: HttpRequest) -> JsonResponse:
    data = parse_body(request, OperatorTokenOpIn, max_bytes=ADMIN_BODY_BYTES).model_dump(exclude_unset=True)
    principal = request_principal(request)
    out = await sync_to_async(_run_op, thread_sensitive=False)(principal, data)
    return JsonResponse(out)
