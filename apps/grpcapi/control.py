"""Run-control RPCs beside Run: SpawnRunBatch (POST /v1/runs:batch, join or detach: the route's
own answer, apps.runs.api.batch.batch_answer), CancelTurn (POST /v1/runs/{id}/cancel), ResolveInterrupt
(POST /v1/runs/{id}/interrupts/{id}/resolve), CompactRun (POST /v1/runs/{id}/compact) and
ReplaySession (POST /v1/sessions/{id}/replay), each through its route's schema and service.

CompactRun queues the compaction for the run's next iteration, as the route does (202): the
reply says `applied: "queued"` with `compacted` false; the compaction event appears on the
run's stream. ReplaySession's `compress` has no counterpart here and is refused by name."""

from __future__ import annotations

from typing import Any

from apps.core.http import db_call
from apps.core.types import Principal
from apps.grpcapi import convert
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import ident, only_fields, parsed, unary
from apps.runs.api.batch import batch_answer
from apps.runs.children.schemas import BatchIn
from apps.runs.compaction.services import run_compact
from apps.runs.engine import turncancel
from apps.runs.interrupts import services as interrupts
from apps.runs.schemas import InterruptResolveIn, TurnCancelIn
from apps.runs.sessions import services as session_services
from apps.runs.sessions.schemas import SessionReplayIn


def _resolve(principal: Principal, run_id: str, interrupt_id: str, data: InterruptResolveIn) -> dict[str, Any]:
    reply = interrupts.caller_resolve(
        answer=data.answer, disposition=data.disposition, resolved_by=data.resolved_by, note=data.note, kind=data.kind
    )
    return interrupts.interrupt_resolve(
        tenant_id=principal.read_tenant,
        owner=principal.read_user,
        run_id=run_id,
        interrupt_id=interrupt_id,
        reply=reply,
    )


def _spawn_result(entry: dict[str, Any]) -> pb.SpawnResult:
    return pb.SpawnResult(
        agent_id=entry["agent_id"],
        run_id=entry["run_id"],
        session_id=entry["session_id"],
        status=entry["status"],
        stop_reason=entry.get("stop_reason") or "",
        final_text=entry.get("final_text") or "",
        usage=convert.usage(entry.get("usage") or {}),
        error=entry.get("error") or "",
    )


class ControlRpcs:
    @unary(("POST", "/v1/runs:batch"))
    async def SpawnRunBatch(self, request: pb.BatchSpawnRequest, principal: Principal) -> pb.BatchSpawnResult:
        body: dict[str, Any] = {"spawns": [convert.run_body(s) for s in request.spawns]}
        body |= {k: v for k, v in (("mode", request.mode), ("timeout_ms", request.timeout_ms)) if v}
        out = await batch_answer(principal, parsed(BatchIn, body))
        return pb.BatchSpawnResult(results=[_spawn_result(e) for e in out["results"]], spawned=out["spawned"])

    @unary(("POST", "/v1/runs/x/cancel"))
    async def CancelTurn(self, request: pb.CancelTurnRequest, principal: Principal) -> pb.CancelTurnResponse:
        run_id = ident(request.run_id, "run_id")
        data = parsed(TurnCancelIn, {"reason": request.reason})
        out = await db_call(turncancel.run_turn_cancel)(principal=principal, run_id=run_id, reason=data.reason)
        return pb.CancelTurnResponse(run_id=out["run_id"], stopped=bool(out["stopped"]), parked=bool(out["parked"]))

    @unary(("POST", "/v1/runs/x/interrupts/x/resolve"))
    async def ResolveInterrupt(
        self, request: pb.ResolveInterruptRequest, principal: Principal
    ) -> pb.ResolveInterruptResponse:
        run_id = ident(request.run_id, "run_id")
        interrupt_id = ident(request.interrupt_id, "interrupt_id")
        body = {k: v for k, v in (("kind", request.kind), ("resolved_by", request.resolved_by)) if v}
        body |= {"answer": request.answer, "disposition": request.disposition or "answer"}
        data = parsed(InterruptResolveIn, body)
        out = await db_call(_resolve)(principal, run_id, interrupt_id, data)
        return pb.ResolveInterruptResponse(interrupt_id=out["interrupt_id"], status=out["status"])

    @unary(("POST", "/v1/runs/x/compact"))
    async def CompactRun(self, request: pb.CompactRunRequest, principal: Principal) -> pb.CompactRunResult:
        run_id = ident(request.run_id, "run_id")
        out = await db_call(run_compact)(principal=principal, run_id=run_id, keep_last_n=None, keep_first=None)
        return pb.CompactRunResult(run_id=out["run_id"], compacted=bool(out["compacted"]), applied="queued")

    @unary(("POST", "/v1/sessions/x/replay"))
    async def ReplaySession(self, request: pb.ReplaySessionRequest, principal: Principal) -> pb.ReplaySessionResult:
        session_id = ident(request.session_id, "session_id")
        only_fields(request, {"session_id", "agent"}, "ReplaySession")
        data = parsed(SessionReplayIn, {"agent": request.agent} if request.agent else {})
        out = await db_call(session_services.session_replay)(
            principal=principal, session_id=session_id, agent=data.agent
        )
        return pb.ReplaySessionResult(
            new_session_id=out["new_session_id"], seed_run_id=out["seed_run_id"], events_copied=out["events_copied"]
        )
