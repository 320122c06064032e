"""List routes of the integration surface (issue 38): a run's children and a user's sessions,
cursor-paginated. auth -> query -> selector -> schema; the rules are apps.runs.pages' and
apps.runs.sessions.listing's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import Router

from apps.core.errors import Invalid, NotFound
from apps.core.http import request_principal
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.gateway.fairness.streams import astream_slot
from apps.runs import pages, selectors
from apps.runs.completion.selectors import deliveries_of
from apps.runs.pages_schemas import ChildrenPageOut, RunStateOut, SessionsPageOut, WebhookDeliveriesOut
from apps.runs.presenters import agent_out
from apps.runs.query import query_object, query_time
from apps.runs.sessions.listing import SessionFilter, sessions_page
from apps.runs.streams import keepalive_seconds, sse_encode
from apps.runs.userstream import MAX_LIFETIME_S, Wanted, user_state_frames

router = Router(tags=["runs"])
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _ident(value: str, what: str) -> None:
    if value and not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")


@router.get(
    "/runs/{run_id}/children",
    response={200: ChildrenPageOut},
    summary="A run's direct sub-agent runs, newest first, cursor-paginated (ListChildRuns)",
)
def runs_children(
    request: HttpRequest, run_id: str, status: str = "all", limit: int = pages.DEFAULT_LIMIT, cursor: str = ""
) -> dict[str, Any]:
    _ident(run_id, "run_id")
    who = request_principal(request)
    parent = selectors.run_get(tenant_id=who.read_tenant, run_id=run_id, owner=who.read_user)
    page = pages.runs_page(
        tenant_id=parent.tenant_id,
        reader=who.read_user,
        f=pages.RunFilter(status=status, parent_id=parent.id),
        limit=limit,
        cursor=cursor,
    )
    return {"agents": [agent_out(r) for r in page.rows], "next_cursor": page.next_cursor}


@router.get(
    "/sessions",
    response={200: SessionsPageOut},
    summary="A user's conversations, latest activity first, cursor-paginated (filters: user_id, agent, "
    "metadata, active_after/before)",
)
def sessions_list(
    request: HttpRequest,
    user_id: str = "",
    agent: str = "",
    metadata: str = "",
    active_after: str = "",
    active_before: str = "",
    limit: int = 50,
    cursor: str = "",
) -> dict[str, Any]:
    _ident(user_id, "user_id")
    _ident(agent, "agent")
    who = request_principal(request)
    if who.read_user is not None and user_id and user_id != who.read_user:
        return {"sessions": [], "next_cursor": ""}  # an isolated member sees no other user's (SPEC 8)
    wanted = SessionFilter(
        user_id=who.read_user or user_id,
        agent=agent,
        metadata=query_object(metadata, "metadata"),
        active_after=query_time(active_after, "active_after"),
        active_before=query_time(active_before, "active_before"),
    )
    page = sessions_page(tenant_id=who.read_tenant, f=wanted, limit=limit, cursor=cursor)
    return {"sessions": page.sessions, "next_cursor": page.next_cursor}


@router.get(
    "/runs/{run_id}/webhooks",
    response={200: WebhookDeliveriesOut},
    summary="A run's completion-webhook deliveries: state, attempts, last answer",
)
def runs_webhooks(request: HttpRequest, run_id: str) -> dict[str, Any]:
    _ident(run_id, "run_id")
    who = request_principal(request)
    run = selectors.run_get(tenant_id=who.read_tenant, run_id=run_id, owner=who.read_user)
    return {"deliveries": deliveries_of(run_id=run.id)}


@router.get(
    "/users/{user_id}/agents/stream",
    response={200: RunStateOut},
    summary="SSE of a user's run-state changes: stream_open, then run_state frames (?status=a,b, ?agent=)",
)
async def users_agents_stream(
    request: HttpRequest, user_id: str, status: str = "", agent: str = ""
) -> HttpResponseBase:
    _ident(user_id, "user_id")
    _ident(agent, "agent")
    who: Principal = request_principal(request)
    if who.read_user is not None and who.read_user != user_id:
        raise NotFound(f"unknown user {user_id}", code="not_found")  # an isolated member follows only itself
    wanted = Wanted(
        tenant_id=who.read_tenant,
        user_id=user_id,
        statuses=frozenset(s.strip() for s in status.split(",") if s.strip()),
        agent=agent,
    )
    slot = await astream_slot(who)
    deadline = time.monotonic() + MAX_LIFETIME_S

    async def stream() -> AsyncIterator[bytes]:
        async with slot.held():
            async with aclosing(user_state_frames(wanted, keepalive_seconds())) as frames:
                async for frame in frames:
                    yield sse_encode(frame)
                    if slot.expired() or time.monotonic() > deadline:
                        yield b": stream lifetime reached; reconnect\n\n"
                        return

    return StreamingHttpResponse(stream(), content_type="text/event-stream", headers=SSE_HEADERS)
