"""Schedules admin REST (SPEC 2.6). The scope gate (SPEC 2.1) puts
`/v1/_schedules/*` behind substrate:tenant; a tenant principal reaches only
its own tenant's schedules (another's is a 404), an admin any, and
`?tenant=` focuses an admin's list."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import db_call, request_principal
from apps.core.ids import is_ident
from apps.triggers import services
from apps.triggers.schemas import SchedulePausedOut, ScheduleRunNowOut, SchedulesOut, ScheduleStateOut

router = Router(tags=["schedules"])

_DEF = "/_schedules/{def_id}"


def _def_id(def_id: str) -> str:
    if not def_id.startswith("def_") or not is_ident(def_id):
        raise Invalid(f"invalid def_id {def_id[:40]!r} (want def_<hex>)", code="invalid_def_id")
    return def_id


def _tenant(request: HttpRequest) -> str | None:
    tenant = request.GET.get("tenant")
    if tenant is not None and tenant != "" and not is_ident(tenant):
        raise Invalid("tenant must match [A-Za-z0-9_-]{1,128}", code="invalid_tenant")
    return tenant


@router.get(
    "/_schedules/list-all",
    response=SchedulesOut,
    operation_id="schedules_list_all",
    summary="Active schedules and their state",
)
async def schedules_list_all(request: HttpRequest) -> JsonResponse:
    principal, tenant = request_principal(request), _tenant(request)
    return JsonResponse(await db_call(services.schedules_list)(principal=principal, tenant=tenant))


@router.get(
    _DEF + "/state",
    response=ScheduleStateOut,
    operation_id="schedule_state",
    summary="One schedule's state; 404 not_found",
)
async def schedule_state(request: HttpRequest, def_id: str) -> JsonResponse:
    principal = request_principal(request)
    return JsonResponse(await db_call(services.schedule_state)(principal=principal, def_id=_def_id(def_id)))


@router.post(
    _DEF + "/run-now", response=ScheduleRunNowOut, operation_id="schedule_run_now", summary="Fire at the next tick"
)
async def schedule_run_now(request: HttpRequest, def_id: str) -> JsonResponse:
    principal = request_principal(request)
    return JsonResponse(await db_call(services.schedule_run_now)(principal=principal, def_id=_def_id(def_id)))


@router.post(
    _DEF + "/pause", response=SchedulePausedOut, operation_id="schedule_pause", summary="Stop firing until resumed"
)
async def schedule_pause(request: HttpRequest, def_id: str) -> JsonResponse:
    principal = request_principal(request)
    return JsonResponse(await db_call(services.schedule_pause)(principal=principal, def_id=_def_id(def_id)))


@router.post(
    _DEF + "/resume",
    response=SchedulePausedOut,
    operation_id="schedule_resume",
    summary="Fire again from the next slot",
)
async def schedule_resume(request: HttpRequest, def_id: str) -> JsonResponse:
    principal = request_principal(request)
    return JsonResponse(await db_call(services.schedule_resume)(principal=principal, def_id=_def_id(def_id)))
