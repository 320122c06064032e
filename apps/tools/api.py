"""Admin routes of the tools app: `POST /v1/_volumedef`, the VolumeDef
op-dispatch (create | get | list | delete | purge) in the caller's tenant."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.core.types import Principal
from apps.tools import errors, selectors, services
from apps.tools.schemas import VolumeDefOpIn

router = Router(tags=["volumes"])
OPS = ("create", "get", "list", "delete", "purge")


def _dispatch(principal: Principal, body: VolumeDefOpIn) -> dict[str, Any]:
    tenant = principal.tenant_id
    if body.op == "create":
        return services.volume_def_create(tenant_id=tenant, name=body.name, mode=body.mode)
    if body.op == "get":
        return services.volume_def_get(tenant_id=tenant, name=body.name)
    if body.op == "list":
        return {"volumes": [services.volume_def_out(r) for r in selectors.volume_defs_list(tenant_id=tenant)]}
    if body.op == "delete":
        return services.volume_def_delete(tenant_id=tenant, name=body.name)
    if body.op == "purge":
        return services.volume_def_purge(tenant_id=tenant, name=body.name)
    raise Invalid(f"unknown op {body.op!r}; one of {', '.join(OPS)}", code=errors.VOLUME_OP_INVALID)


@router.post(
    "/_volumedef",
    operation_id="volumedef_op",
    summary="VolumeDef op-dispatch (create, get, list, delete, purge) in the caller's tenant",
    openapi_extra=openapi_body(VolumeDefOpIn, enums={"op": OPS}),
)
async def volumedef_op(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, VolumeDefOpIn, max_bytes=64 * 1024)
    return JsonResponse(await db_call(_dispatch)(request_principal(request), body))
