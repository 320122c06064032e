"""Admin routes of the tools app: `POST /v1/_volumedef`, the VolumeDef
op-dispatch (create | get | list | delete | purge) in the caller's tenant
(apps.tools.services.volume_def_dispatch, which gRPC's VolumeDef calls too)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.tools import services
from apps.tools.schemas import VolumeDefOpIn, VolumeDefOpOut

router = Router(tags=["volumes"])


@router.post(
    "/_volumedef",
    response=VolumeDefOpOut,
    operation_id="volumedef_op",
    summary="VolumeDef op-dispatch (create, get, list, delete, purge) in the caller's tenant",
    openapi_extra=openapi_body(VolumeDefOpIn, enums={"op": services.VOLUME_OPS}),
)
async def volumedef_op(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, VolumeDefOpIn, max_bytes=64 * 1024)
    return JsonResponse(await db_call(services.volume_def_dispatch)(request_principal(request), body))
