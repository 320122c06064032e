"""The runtime-admin and substrate RPCs: pause/resume/state (POST /v1/_pause, /v1/_resume,
GET /v1/_state) and the def op-dispatch RPCs (POST /v1/_<kind>def, /v1/_operatortokendef,
/v1/_volumedef),
each through the service its HTTP route calls, with the route's scope and schema.

A def RPC answers loomcycle's SubstrateResponse: the op's JSON in `output_json`, or a refused
op as `is_error` with the refusal's text (the client's SubstrateToolRefusedError). An unknown
or another tenant's def_id is NOT_FOUND and a per-tenant quota RESOURCE_EXHAUSTED, statuses as
over HTTP (404, 429)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from apps.core.errors import Invalid, NotFound
from apps.core.http import db_call, loads_checked
from apps.core.types import Principal
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import parsed, unary
from apps.runs import selectors, services
from apps.runs.schemas import PauseIn
from apps.substrate import services as substrate
from apps.substrate import tokens
from apps.substrate.api_auth import OperatorTokenOpIn
from apps.substrate.kinds import KINDS, Refused, RefusedNotFound
from apps.substrate.schemas import DefOpIn
from apps.tools.schemas import VolumeDefOpIn
from apps.tools.services import volume_def_dispatch

Dispatch = Callable[[Principal, dict[str, Any]], Awaitable[dict[str, Any]]]


def _input(request: pb.SubstrateRequest) -> dict[str, Any]:
    if not request.input_json:
        raise Invalid("input_json is required (the tool's input as a JSON object)", code="invalid_body")
    data = loads_checked(request.input_json)
    if not isinstance(data, dict):
        raise Invalid("input_json must be a JSON object", code="invalid_body")
    return data


async def _substrate(request: pb.SubstrateRequest, principal: Principal, dispatch: Dispatch) -> pb.SubstrateResponse:
    try:
        out = await dispatch(principal, _input(request))
    except RefusedNotFound as exc:
        raise NotFound(exc.message, code="not_found") from exc
    except Refused as exc:
        info = pb.ErrorInfo(category=exc.code, description=exc.message)
        return pb.SubstrateResponse(output_json=exc.message.encode(), is_error=True, error_info=info)
    return pb.SubstrateResponse(output_json=json.dumps(out, separators=(",", ":")).encode())


def _kind_dispatch(key: str) -> Dispatch:
    async def dispatch(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
        body = parsed(DefOpIn, data).model_dump(exclude_unset=True)
        return await substrate.def_dispatch_async(KINDS[key], substrate.operator_author(principal), body)

    return dispatch


async def _token_dispatch(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    body = parsed(OperatorTokenOpIn, data).model_dump(exclude_unset=True)
    return await db_call(tokens.token_dispatch)(body, by=principal.subject)


async def _volume_dispatch(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    return await db_call(volume_def_dispatch)(principal, parsed(VolumeDefOpIn, data))


def _def_rpc(key: str, path: str) -> Callable[..., Awaitable[pb.SubstrateResponse]]:
    special: dict[str, Dispatch] = {"operatortoken": _token_dispatch, "volume": _volume_dispatch}
    dispatch = special.get(key) or _kind_dispatch(key)

    async def body(self: Any, request: pb.SubstrateRequest, principal: Principal) -> pb.SubstrateResponse:
        return await _substrate(request, principal, dispatch)

    body.__name__ = path
    return unary(("POST", path))(body)


class AdminRpcs:
    @unary(("POST", "/v1/_pause"))
    async def PauseRuntime(self, request: pb.PauseRuntimeRequest, principal: Principal) -> pb.PauseRuntimeResponse:
        data = parsed(PauseIn, {"timeout_ms": request.timeout_ms} if request.timeout_ms else {})
        out = await services.runtime_pause(timeout_ms=data.timeout_ms)
        return pb.PauseRuntimeResponse(
            status=out["state"],
            duration_ms=out["duration_ms"],
            force_cancelled_count=out["force_cancelled_count"],
            paused_runs_count=out["paused_runs_count"],
            warnings=out["warnings"],
        )

    @unary(("POST", "/v1/_resume"))
    async def ResumeRuntime(self, request: pb.ResumeRuntimeRequest, principal: Principal) -> pb.ResumeRuntimeResponse:
        out = await db_call(services.runtime_resume)()
        return pb.ResumeRuntimeResponse(
            status=out["state"], resumed_run_count=out["resumed_runs_count"], warnings=out["warnings"]
        )

    @unary(("GET", "/v1/_state"))
    async def GetRuntimeState(
        self, request: pb.GetRuntimeStateRequest, principal: Principal
    ) -> pb.RuntimeStateResponse:
        state = await db_call(services.runtime_state_get)()
        paused = await db_call(selectors.paused_runs_count)()
        return pb.RuntimeStateResponse(status=state, paused_run_count=paused)

    AgentDef = _def_rpc("agent", "/v1/_agentdef")
    SkillDef = _def_rpc("skill", "/v1/_skilldef")
    MCPServerDef = _def_rpc("mcpserver", "/v1/_mcpserverdef")
    ScheduleDef = _def_rpc("schedule", "/v1/_scheduledef")
    WebhookDef = _def_rpc("webhook", "/v1/_webhookdef")
    A2AServerCardDef = _def_rpc("a2aservercard", "/v1/_a2aservercarddef")
    A2AAgentDef = _def_rpc("a2aagent", "/v1/_a2aagentdef")
    OperatorTokenDef = _def_rpc("operatortoken", "/v1/_operatortokendef")
    VolumeDef = _def_rpc("volume", "/v1/_volumedef")
