"""Runs routes (SPEC 2.3, 2.4): auth -> schema -> service/selector -> schema."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.core.numbers import parse_count
from apps.core.timefmt import ts
from apps.core.types import Principal
from apps.gateway.fairness.streams import StreamSlot, astream_slot
from apps.runs import pages, selectors, services
from apps.runs.credentials import credentials_from_wire
from apps.runs.deletion import run_tree_delete
from apps.runs.models import Run
from apps.runs.pages_schemas import RunsPageOut
from apps.runs.presenters import agent_out
from apps.runs.query import query_object, query_time
from apps.runs.schemas import (
    AgentsOut,
    CancelIn,
    EventsOut,
    InputIn,
    PauseIn,
    RunCancelOut,
    RunCreatedOut,
    RunCreateIn,
    RunInputOut,
    RunOut,
    RuntimePauseOut,
    RuntimeResumeOut,
    RuntimeStateOut,
    RunTreeDeletedOut,
)
from apps.runs.stream_admission import admit_streamed
from apps.runs.streams import LIFETIME_COMMENT, Frame, admitted_from, keepalive_seconds, run_frames, run_sse, sse_encode

log = logging.getLogger("loomcycle.api.runs")
router = Router(tags=["runs"])

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _check_ident(value: str, what: str) -> None:
    if not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")


def run_create_data(data: RunCreateIn) -> services.RunCreate:
    """The service's input from the wire's (POST /v1/runs; the session routes adjust it)."""
    return services.RunCreate(
        agent=data.agent,
        segments=data.segment_list(),
        tools=data.tools,
        allowed_hosts=data.allowed_hosts,
        user_id=data.user_id or "",
        tenant_id=data.tenant_id or "",
        agent_id=data.agent_id,
        metadata=data.metadata,
        interactive=data.interactive,
        max_iterations=data.max_iterations,
        user_tier=data.user_tier,
        credentials=credentials_from_wire(user_bearer=data.user_bearer, user_credentials=data.user_credentials),
        session_id=data.session_id,
        multitask_strategy=data.multitask_strategy,
        options=data.options(),
        retention=data.retention or "",
        webhook=data.webhook,
    )


def _create(principal: Principal, data: RunCreateIn) -> Run:
    try:
        return services.run_create(principal=principal, data=run_create_data(data))
    finally:
        connection.close()


@router.post(
    "/runs",
    response={202: RunCreatedOut},
    openapi_extra=openapi_body(RunCreateIn),
    summary="Start a run (SSE by default; background:true returns 202 JSON)",
)
async def runs_create(request: HttpRequest) -> HttpResponseBase:
    data = parse_body(request, RunCreateIn, max_bytes=settings.LOOMCYCLE.max_request_bytes)
    principal: Principal = request_principal(request)
    return await run_response(principal, data, partial(_create, principal, data))


async def run_response(principal: Principal, data: RunCreateIn, create: Callable[[], Run]) -> HttpResponseBase:
    """Start the run `create` makes (in a thread) and answer as POST /v1/runs does: SSE,
    or 202 JSON with `background`."""
    if data.background:
        run = await sync_to_async(create, thread_sensitive=False)()
        body = {"agent_id": run.agent_id, "run_id": run.id, "session_id": run.session_id, "status": run.status}
        return JsonResponse(body, status=202)
    run, slot = await admit_streamed(principal, create)
    stream = _post_stream(run, principal, slot, cancel_on_disconnect=data.cancel_on_disconnect)
    return StreamingHttpResponse(stream, content_type="text/event-stream", headers=_SSE_HEADERS)


async def _post_stream(
    run: Run, principal: Principal, slot: StreamSlot, *, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    async with slot.held():
        async for chunk in _post_frames(run, principal, slot, cancel_on_disconnect=cancel_on_disconnect):
            yield chunk


async def _post_frames(
    run: Run, principal: Principal, slot: StreamSlot, *, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    yield sse_encode(Frame("session", {"type": "session", "text": run.session_id}))
    yield sse_encode(
        Frame(
            "agent",
            {
                "agent_id": run.agent_id,
                "run_id": run.id,
                "session_id": run.session_id,
                "parent_agent_id": None,
                "parent_context": run.parent_context,
            },
        )
    )
    finished = False
    # Daphne (Twisted) notices a hang-up only when a write fails, so a stream
    # that must cancel on disconnect writes a keepalive every second.
    keepalive = 1.0 if cancel_on_disconnect else keepalive_seconds()
    try:
        async with aclosing(run_frames(run.id, await admitted_from(run), keepalive)) as frames:
            async for frame in frames:
                yield sse_encode(frame)
                if slot.expired():
                    yield LIFETIME_COMMENT
                    break
        finished = True  # the run ended, or the stream's lifetime did: neither is a disconnect
    finally:
        if not finished and cancel_on_disconnect:
            _in_background(_cancel_async(principal, run.agent_id, "client disconnected"))


# Tasks started after a response ended: the event loop keeps only a weak
# reference to a task, so this set holds each one until it is done.
_BACKGROUND: set[asyncio.Task[None]] = set()


def _in_background(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _BACKGROUND.add(task)
    task.add_done_callback(_background_done)


def _background_done(task: asyncio.Task[None]) -> None:
    _BACKGROUND.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task %s failed", task.get_coro(), exc_info=exc)


async def _cancel_async(principal: Principal, agent_id: str, reason: str) -> None:
    await sync_to_async(_cancel, thread_sensitive=False)(principal, agent_id, reason)


def _cancel(principal: Principal, agent_id: str, reason: str) -> dict[str, Any]:
    try:
        return services.run_cancel(principal=principal, agent_id=agent_id, reason=reason)
    finally:
        connection.close()


def _visible_run(request: HttpRequest, *, agent_id: str | None = None, run_id: str | None = None) -> Run:
    """The run by id, as the caller may see it (its tenant; an isolated member's own runs only)."""
    who = request_principal(request)
    return selectors.run_get(tenant_id=who.read_tenant, agent_id=agent_id, run_id=run_id, owner=who.read_user)


@router.get("/agents/{agent_id}", response=RunOut, summary="Run status by the caller's agent_id")
def agents_get(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    _check_ident(agent_id, "agent_id")
    return agent_out(_visible_run(request, agent_id=agent_id))


@router.get("/runs/{run_id}", response=RunOut, summary="Run status by run_id")
def runs_get(request: HttpRequest, run_id: str) -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    return agent_out(_visible_run(request, run_id=run_id))


@router.delete(
    "/runs/{run_id}",
    response={200: RunTreeDeletedOut, 202: RunTreeDeletedOut},
    summary="Delete an ended run with its descendants (409 run_live unless ?cancel=true: then 202)",
)
def runs_delete(request: HttpRequest, run_id: str, cancel: bool = False) -> JsonResponse:
    _check_ident(run_id, "run_id")
    body = run_tree_delete(principal=request_principal(request), run_id=run_id, cancel_live=cancel)
    return JsonResponse(body, status=202 if body["deleting"] else 200)


@router.get("/users/{user_id}/agents", response=AgentsOut, summary="A user's runs (?status=running|all|<list>)")
def users_agents(request: HttpRequest, user_id: str, status: str = "running") -> dict[str, Any]:
    _check_ident(user_id, "user_id")
    who = request_principal(request)
    runs = selectors.runs_for_user(tenant_id=who.read_tenant, user_id=user_id, status=status, reader=who.read_user)
    return {"agents": [agent_out(r) for r in runs]}


@router.get(
    "/runs",
    response={200: RunsPageOut},
    summary="Runs of the caller's tenant, newest first, cursor-paginated (filters: status, agent, user_id, "
    "metadata, created_after/before; admins: tenant)",
)
def runs_list(
    request: HttpRequest,
    status: str = "running",
    agent: str = "",
    tenant: str = "",
    user_id: str = "",
    metadata: str = "",
    created_after: str = "",
    created_before: str = "",
    limit: int = pages.DEFAULT_LIMIT,
    cursor: str = "",
) -> dict[str, Any]:
    for value, what in ((agent, "agent"), (user_id, "user_id")):
        if value:
            _check_ident(value, what)
    who = request_principal(request)
    tenant_id = tenant if who.read_tenant is None and tenant else who.read_tenant  # `tenant` focuses an admin only
    wanted = pages.RunFilter(
        status=status,
        agent=agent,
        user_id=user_id,
        metadata=query_object(metadata, "metadata"),
        created_after=query_time(created_after, "created_after"),
        created_before=query_time(created_before, "created_before"),
    )
    page = pages.runs_page(tenant_id=tenant_id, reader=who.read_user, f=wanted, limit=limit, cursor=cursor)
    return {"runs": [{**agent_out(r), "tenant_id": r.tenant_id} for r in page.rows], "next_cursor": page.next_cursor}


@router.get("/runs/{run_id}/events", response=EventsOut, summary="Persisted events with seq > from_seq")
def runs_events(request: HttpRequest, run_id: str, from_seq: int = 0, limit: int = 500) -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    if from_seq < 0 or not 1 <= limit <= 5000:
        raise Invalid("from_seq must be >= 0 and limit between 1 and 5000", code="invalid_limit")
    run = _visible_run(request, run_id=run_id)
    rows = selectors.run_events_since(run_id=run.id, from_seq=from_seq, limit=limit)
    events = [{**r, "created_at": ts(r["created_at"])} for r in rows]
    status = agent_out(run)["status"]
    return {"run_id": run.id, "events": events, "last_seq": run.last_seq, "status": status, "state": run.status}


def _resume_from(request: HttpRequest, from_seq: int | None) -> int:
    if from_seq is not None:
        return from_seq
    return parse_count(request.headers.get("Last-Event-ID")) or 0  # unusable: replay from the start


@router.get("/runs/{run_id}/stream", summary="SSE: replay from Postgres, then live tail")
async def runs_stream(
    request: HttpRequest, run_id: str, from_seq: int | None = None, live: bool = True
) -> HttpResponseBase:
    """`live=false`: committed events only, each whole (no live text frames; docs/api.md, "Live text")."""
    _check_ident(run_id, "run_id")
    principal: Principal = request_principal(request)
    run = await sync_to_async(_get_run, thread_sensitive=False)(principal, run_id)
    start = _resume_from(request, from_seq)
    if start < 0:
        raise Invalid("from_seq must be >= 0", code="invalid_request")

    slot = await astream_slot(principal)

    stream = run_sse(run, slot, start, live=live)
    return StreamingHttpResponse(stream, content_type="text/event-stream", headers=_SSE_HEADERS)


def _get_run(principal: Principal, run_id: str) -> Run:
    try:
        return selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    finally:
        connection.close()


@router.post(
    "/agents/{agent_id}/cancel",
    response=RunCancelOut,
    exclude_unset=True,  # the body as the service made it: a finished run's has status, a cancel's cascaded
    openapi_extra=openapi_body(CancelIn),
    summary="Cancel a run and its live descendants",
)
def agents_cancel(request: HttpRequest, agent_id: str) -> dict[str, Any]:
    _check_ident(agent_id, "agent_id")
    data = parse_body(request, CancelIn, max_bytes=1024 * 1024, required=False)
    return services.run_cancel(principal=request_principal(request), agent_id=agent_id, reason=data.reason)


@router.post(
    "/runs/{run_id}/input",
    response=RunInputOut,
    openapi_extra=openapi_body(InputIn),
    summary="Steer a running run, or continue a parked interactive run",
)
def runs_input(request: HttpRequest, run_id: str) -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    data = parse_body(request, InputIn, max_bytes=1024 * 1024 + 1024)
    return services.run_input(principal=request_principal(request), run_id=run_id, text=data.text)


@router.post(
    "/_pause",
    response=RuntimePauseOut,
    openapi_extra=openapi_body(PauseIn),
    summary="Park every run at its next boundary",
)
async def runtime_pause(request: HttpRequest) -> dict[str, Any]:
    data = parse_body(request, PauseIn, max_bytes=1024 * 1024, required=False)
    return await services.runtime_pause(timeout_ms=data.timeout_ms)


@router.post("/_resume", response=RuntimeResumeOut, summary="Resume parked runs")
def runtime_resume(request: HttpRequest) -> dict[str, Any]:
    return services.runtime_resume()


@router.get("/_state", response=RuntimeStateOut, summary="Runtime pause state")
def runtime_state(request: HttpRequest) -> dict[str, Any]:
    return {"state": services.runtime_state_get(), "paused_runs_count": selectors.paused_runs_count()}
