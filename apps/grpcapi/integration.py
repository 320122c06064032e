"""The integration RPCs (issue 38): ListChildRuns and StreamUserRunStates, each the twin of its
HTTP route (GET /v1/runs/{id}/children, GET /v1/users/{user_id}/agents/stream): same selectors,
same stream, presented as protobuf."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from apps.core.errors import ApplicationError, NotFound
from apps.core.http import db_call
from apps.core.types import Principal
from apps.gateway.fairness.streams import astream_slot
from apps.grpcapi import convert
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import ident, only_fields, streaming, unary
from apps.runs import pages, selectors
from apps.runs.streams import KEEPALIVE, keepalive_seconds
from apps.runs.userstream import MAX_LIFETIME_S, Wanted, user_state_frames

_PARENT_CONTEXT_FIELDS = {f.name for f in pb.ParentContext.DESCRIPTOR.fields}


class UserStreamLifetime(ApplicationError):
    """The stream's lifetime (30 minutes, or LOOMCYCLE_MAX_STREAM_SECONDS) is over: UNAVAILABLE, reconnect."""

    status, code = 503, "stream_lifetime"


def _children(principal: Principal, run_id: str, limit: int, cursor: str) -> pages.Page:
    parent = selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    wanted = pages.RunFilter(status="all", parent_id=parent.id)
    return pages.runs_page(tenant_id=parent.tenant_id, reader=principal.read_user, f=wanted, limit=limit, cursor=cursor)


def run_state(data: dict[str, Any]) -> pb.RunStateEvent:
    context = data.get("parent_context") or {}
    return pb.RunStateEvent(
        run_id=data["run_id"],
        agent_id=data["agent_id"],
        agent=data["agent"],
        user_id=data["user_id"],
        parent_agent_id=data["parent_agent_id"] or "",
        parent_run_id=data["parent_run_id"] or "",
        status=data["status"],
        stop_reason=data["stop_reason"],
        error=data["error"],
        ts=data["ts"],
        awaited_state=data["awaited_state"],
        parent_context=pb.ParentContext(**{k: v for k, v in context.items() if k in _PARENT_CONTEXT_FIELDS}),
    )


class IntegrationRpcs:
    @unary(("GET", "/v1/runs/x/children"))
    async def ListChildRuns(self, request: pb.ListChildRunsRequest, principal: Principal) -> pb.ListChildRunsResponse:
        run_id = ident(request.parent_run_id, "parent_run_id")
        limit = request.limit or pages.DEFAULT_LIMIT
        page = await db_call(_children)(principal, run_id, limit, request.cursor)
        return pb.ListChildRunsResponse(agents=[convert.agent(r) for r in page.rows], next_cursor=page.next_cursor)

    @streaming(("GET", "/v1/users/x/agents/stream"))
    async def StreamUserRunStates(
        self, request: pb.StreamUserRunStatesRequest, principal: Principal
    ) -> AsyncIterator[pb.RunStateEvent]:
        user_id = ident(request.user_id, "user_id")
        only_fields(request, {"user_id", "statuses", "agent"}, "StreamUserRunStates")
        if request.agent:
            ident(request.agent, "agent")
        if principal.read_user is not None and principal.read_user != user_id:
            raise NotFound(f"unknown user {user_id}", code="not_found")
        wanted = Wanted(principal.read_tenant, user_id, frozenset(request.statuses), request.agent)
        slot = await astream_slot(principal)
        deadline = time.monotonic() + MAX_LIFETIME_S
        async with slot.held(), aclosing(user_state_frames(wanted, keepalive_seconds())) as frames:
            async for frame in frames:
                if frame is not KEEPALIVE and frame.event == "run_state":
                    yield run_state(frame.data)
                if slot.expired() or time.monotonic() > deadline:
                    raise UserStreamLifetime("stream lifetime reached; reconnect")
