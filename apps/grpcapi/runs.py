"""The run RPCs: each parses, calls the service or selector its HTTP route calls, presents.

Run / Continue stream as POST /v1/runs does (SPEC 3.2): `session`, the `agent` registration
frame, then the run's persisted events from Postgres (apps.runs.streams.run_frames: replay,
then live tail, gap-free) until it ends; StreamRun re-attaches from a seq (SPEC 3.4). A client
that goes away ends its stream, never the run (durable runs, DESIGN.md)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from django.db import connection
from google.protobuf.timestamp_pb2 import Timestamp

import loomcycle_project
from apps.core.errors import ApplicationError, Invalid
from apps.core.http import db_call
from apps.core.types import Principal
from apps.gateway.fairness.streams import StreamSlot, astream_slot
from apps.grpcapi import convert
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import ident, only_fields, parsed, streaming, unary
from apps.runs import selectors, services
from apps.runs.api import run_create_data
from apps.runs.models import Run
from apps.runs.schemas import InputIn, RunCreateIn
from apps.runs.sessions import services as session_services
from apps.runs.sessions.schemas import SessionMessageIn
from apps.runs.stream_admission import admit_streamed
from apps.runs.streams import KEEPALIVE, admitted_from, keepalive_seconds, run_frames

STARTED = time.time()


class StreamLifetime(ApplicationError):
    """A stream past LOOMCYCLE_MAX_STREAM_SECONDS: UNAVAILABLE, which a client re-attaches after."""

    status, code = 503, "stream_lifetime"


def _create(principal: Principal, data: RunCreateIn) -> Run:
    try:
        return services.run_create(principal=principal, data=run_create_data(data))
    finally:
        connection.close()


def _continue(principal: Principal, session_id: str, data: SessionMessageIn) -> Run:
    try:  # the session's own agent, as POST /v1/sessions/{id}/messages
        create = dataclasses.replace(run_create_data(data), agent="")
        return session_services.session_continue(principal=principal, session_id=session_id, data=create)
    finally:
        connection.close()


async def _events(run_id: str, from_seq: int, slot: StreamSlot) -> AsyncIterator[pb.Event]:
    """The run's frames as Events until it ends (keepalives are HTTP/2's pings here)."""
    async with slot.held(), aclosing(run_frames(run_id, from_seq, keepalive_seconds())) as frames:
        async for frame in frames:
            if frame is not KEEPALIVE:
                yield convert.event(frame)
            if slot.expired():  # LOOMCYCLE_MAX_STREAM_SECONDS: the client re-attaches with StreamRun
                raise StreamLifetime("stream lifetime reached; re-attach with StreamRun(from_seq)")


async def _registered(run: Run, slot: StreamSlot) -> AsyncIterator[pb.Event]:
    yield pb.Event(type="session", text=run.session_id)
    yield convert.agent_frame(run)
    async for event in _events(run.id, await admitted_from(run), slot):
        yield event


class RunRpcs:
    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        """Unauthenticated, as loomcycle's (and /healthz's plain answer)."""
        uptime = int(time.time() - STARTED)
        return pb.HealthResponse(ok=True, commit=loomcycle_project.__version__, uptime_seconds=uptime)

    @streaming(("POST", "/v1/runs"))
    async def Run(self, request: pb.RunRequest, principal: Principal) -> AsyncIterator[pb.Event]:
        data = parsed(RunCreateIn, convert.run_body(request))
        run, slot = await admit_streamed(principal, lambda: _create(principal, data))
        async for event in _registered(run, slot):
            yield event

    @streaming(("POST", "/v1/sessions/x/messages"))
    async def Continue(self, request: pb.ContinueRequest, principal: Principal) -> AsyncIterator[pb.Event]:
        session_id = ident(request.session_id, "session_id")
        data = parsed(SessionMessageIn, convert.continue_body(request))
        run, slot = await admit_streamed(principal, lambda: _continue(principal, session_id, data))
        async for event in _registered(run, slot):
            yield event

    @streaming(("GET", "/v1/runs/x/stream"))
    async def StreamRun(self, request: pb.StreamRunRequest, principal: Principal) -> AsyncIterator[pb.Event]:
        run_id = ident(request.run_id, "run_id")
        if request.from_seq < 0:
            raise Invalid("from_seq must be >= 0", code="invalid_request")
        run = await _visible(principal, run_id=run_id)
        slot = await astream_slot(principal)
        async for event in _events(run.id, request.from_seq, slot):
            yield event

    @unary(("GET", "/v1/runs/x"))
    async def GetRun(self, request: pb.GetRunRequest, principal: Principal) -> pb.Agent:
        return await db_call(_agent)(principal, run_id=ident(request.run_id, "run_id"))

    @unary(("GET", "/v1/agents/x"))
    async def GetAgent(self, request: pb.GetAgentRequest, principal: Principal) -> pb.Agent:
        return await db_call(_agent)(principal, agent_id=ident(request.agent_id, "agent_id"))

    @unary(("POST", "/v1/agents/x/cancel"))
    async def CancelAgent(self, request: pb.CancelAgentRequest, principal: Principal) -> pb.CancelAgentResponse:
        agent_id = ident(request.agent_id, "agent_id")
        out = await db_call(services.run_cancel)(principal=principal, agent_id=agent_id, reason=request.reason)
        count = 1 + len(out.get("cascaded", [])) if out["cancelled"] else 0
        return pb.CancelAgentResponse(cancelled_count=count)

    @unary(("POST", "/v1/runs/x/input"))
    async def RunInput(self, request: pb.RunInputRequest, principal: Principal) -> pb.RunInputResponse:
        run_id = ident(request.run_id, "run_id")
        only_fields(request, {"run_id", "text", "source"}, "RunInput")
        data = parsed(InputIn, {"text": request.text})
        out = await db_call(services.run_input)(principal=principal, run_id=run_id, text=data.text)
        return pb.RunInputResponse(run_id=out["run_id"], delivered=bool(out["delivered"]))

    @unary(("GET", "/v1/sessions/x/transcript"))
    async def GetTranscript(self, request: pb.GetTranscriptRequest, principal: Principal) -> pb.Transcript:
        session_id = ident(request.session_id, "session_id")
        out = await db_call(session_services.session_transcript)(principal=principal, session_id=session_id)
        return pb.Transcript(events=[_transcript_event(session_id, e) for e in out["events"]])

    @unary(("GET", "/v1/users/x/agents"))
    async def ListUserAgents(
        self, request: pb.ListUserAgentsRequest, principal: Principal
    ) -> pb.ListUserAgentsResponse:
        user_id = ident(request.user_id, "user_id")
        only_fields(request, {"user_id", "status", "statuses"}, "ListUserAgents")
        status = request.status or ",".join(request.statuses) or "running"
        runs = await db_call(selectors.runs_for_user)(
            tenant_id=principal.read_tenant, user_id=user_id, status=status, reader=principal.read_user
        )
        return pb.ListUserAgentsResponse(agents=[convert.agent(r) for r in runs])


def _visible_run(principal: Principal, **key: str) -> Run:
    return selectors.run_get(tenant_id=principal.read_tenant, owner=principal.read_user, **key)


async def _visible(principal: Principal, **key: str) -> Run:
    return await db_call(_visible_run)(principal, **key)


def _agent(principal: Principal, **key: str) -> pb.Agent:
    return convert.agent(_visible_run(principal, **key))


def _transcript_event(session_id: str, event: dict[str, Any]) -> pb.TranscriptEvent:
    ts = Timestamp()
    ts.FromNanoseconds(int(event["ts_ns"]))
    return pb.TranscriptEvent(
        seq=event["seq"],
        session_id=session_id,
        run_id=event["run_id"],
        ts=ts,
        type=event["type"],
        payload=json.dumps(event["event"], separators=(",", ":")).encode(),
    )
