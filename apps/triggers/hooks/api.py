"""`/v1/hooks` (SPEC 2.9): register, list and delete tool-use hooks.

The route gate (apps.substrate.auth) asks for substrate:tenant, with no
tenant-member carve-in. A registration belongs to the caller's tenant; a
tenant lists and deletes only its own (another tenant's id is a 404), an
admin every tenant's.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router
from pydantic import BaseModel, ConfigDict

from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.core.types import Principal
from apps.triggers.hooks import presenters, selectors, services
from apps.triggers.schemas import HookDeletedOut, HookRegisteredOut, HooksOut

router = Router(tags=["hooks"])
ADMIN_BODY_BYTES = 1024 * 1024


class HookRegisterIn(BaseModel):
    """Every field is checked by services.hook_spec (400 invalid_registration), so all are loose here."""

    model_config = ConfigDict(extra="allow")

    owner: Any = None
    name: Any = None
    phase: Any = None
    agents: Any = None
    tools: Any = None
    callback_url: Any = None
    fail_mode: Any = None
    timeout_ms: Any = None


def _register(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    row = services.hook_register(principal=principal, spec=services.hook_spec(data))
    return {"id": row.hook_id}


def _list(principal: Principal) -> dict[str, Any]:
    return {"hooks": [presenters.hook_out(row) for row in selectors.hook_list(tenant=principal.read_tenant)]}


def _delete(principal: Principal, hook_id: str) -> dict[str, Any]:
    return {"deleted": services.hook_delete(principal=principal, hook_id=hook_id)}


@router.post(
    "/hooks",
    response=HookRegisteredOut,
    operation_id="hooks_register",
    summary="Register (or replace by owner+name) a tool-use hook; 400 invalid_registration",
    openapi_extra=openapi_body(HookRegisterIn),
)
async def hooks_register(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, HookRegisterIn, max_bytes=ADMIN_BODY_BYTES)
    data = {**body.model_dump(exclude_unset=True), **(body.model_extra or {})}
    return JsonResponse(await db_call(_register)(request_principal(request), data))


@router.get(
    "/hooks", response=HooksOut, operation_id="hooks_list", summary="The caller's tenant's hooks in chain order"
)
async def hooks_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse(await db_call(_list)(request_principal(request)))


@router.delete(
    "/hooks/{hook_id}", response=HookDeletedOut, operation_id="hooks_delete", summary="Delete a hook; 404 not_found"
)
async def hooks_delete(request: HttpRequest, hook_id: str) -> JsonResponse:
    return JsonResponse(await db_call(_delete)(request_principal(request), hook_id))
