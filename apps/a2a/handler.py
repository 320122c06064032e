"""The SDK's `RequestHandler` over runs: the JSON-RPC transport (the SDK's dispatcher and
SSE) parses and presents, each method here calls the run verb its REST route calls
(apps.a2a.runs) under the same scope check (`authorize` with the REST route's method and
path), and maps the service's refusal to the A2A error a peer expects.

Why not the SDK's `DefaultRequestHandler`: it runs an `AgentExecutor` inside the process
that took the request and keeps tasks in a `TaskStore` and its events in an in-memory queue,
so the web process would own the run. Here a task is a run: its row is the task store, the
Celery worker runs it, and any web replica answers `tasks/get`, `tasks/cancel` or a stream
of it from Postgres (apps.runs.streams), which also survives the web process restarting.

Push-notification configs are the SDK's store and sender over rows (apps.a2a.push).
ListTasks is refused (UnsupportedOperationError): GET /v1/runs lists runs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, NoReturn

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from asgiref.sync import sync_to_async
from google.protobuf.json_format import MessageToDict

from apps.a2a import presenters, push, runs
from apps.a2a.cards import Exposed, exposed_for
from apps.core.errors import ApplicationError
from apps.core.types import Principal
from apps.gateway.fairness.streams import StreamSlot, astream_slot
from apps.runs.models import Run
from apps.runs.streams import KEEPALIVE, admitted_from, keepalive_seconds, run_frames
from apps.substrate.auth import authorize

PRINCIPAL = "loomcycle.principal"
SKILL = "loomcycle.skill"  # the skill of a per-agent endpoint (/a2a/agents/{skill}/jsonrpc)


def _principal(context: ServerCallContext) -> Principal:
    principal = context.state.get(PRINCIPAL)
    if not isinstance(principal, Principal):
        raise InternalError(message="an A2A request reached the handler without an authenticated caller")
    return principal


def _allowed(context: ServerCallContext, method: str, path: str) -> Principal:
    """The caller, holding the scope of the REST route that does the same (runs:create, runs:read)."""
    principal = _principal(context)
    try:
        authorize(principal, method, path)
    except ApplicationError as exc:
        raise InvalidRequestError(message=exc.message, data={"code": exc.code}) from exc
    return principal


def _refused(exc: ApplicationError, *, task_lookup: bool = False) -> NoReturn:
    data = {"code": exc.code, "status": exc.status}
    if exc.status == 404 and task_lookup:
        raise TaskNotFoundError(message=exc.message, data=data) from exc
    if exc.status in (400, 404, 409, 413, 422):
        raise InvalidParamsError(message=exc.message, data=data) from exc
    raise InvalidRequestError(message=exc.message, data=data) from exc


async def _slot(principal: Principal) -> StreamSlot:
    """One of the principal's stream slots (LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL, shared with SSE,
    WebSocket and gRPC streams), taken before anything starts: over the cap, nothing does."""
    try:
        return await astream_slot(principal)
    except ApplicationError as exc:
        _refused(exc)


async def _call(fn: Any, *args: Any, task_lookup: bool = False, **kwargs: Any) -> Any:
    try:
        return await sync_to_async(fn, thread_sensitive=False)(*args, **kwargs)
    except ApplicationError as exc:
        _refused(exc, task_lookup=task_lookup)


def _text(message: Message) -> str:
    texts = [part.text for part in message.parts if part.WhichOneof("content") == "text"]
    if not texts or not "".join(texts).strip():
        raise InvalidParamsError(message="the message has no text part: this runtime's agents take text")
    return "\n\n".join(texts)


def _skill_of(message: Message, context: ServerCallContext, exposed: dict[str, Exposed]) -> Exposed:
    """The exposed agent a new task is for: the endpoint's, else `metadata.skillId`, else the only one."""
    skill = context.state.get(SKILL) or MessageToDict(message.metadata).get("skillId")
    if not skill:
        if len(exposed) == 1:
            return next(iter(exposed.values()))
        raise InvalidParamsError(message=f"name the skill in message.metadata.skillId (one of: {sorted(exposed)})")
    if skill not in exposed:
        raise InvalidParamsError(message=f"unknown skill {skill!r}: this server exposes {sorted(exposed)}")
    return exposed[str(skill)]


class RunsRequestHandler(RequestHandler):
    """A2A methods as run verbs; see the module docstring."""

    def __init__(self) -> None:
        self._push = push.RunsPushConfigStore()

    async def _admit(self, params: SendMessageRequest, context: ServerCallContext) -> tuple[Run, int]:
        """The run a message starts or continues, and the event seq its caller follows from."""
        principal = _allowed(context, "POST", "/v1/runs")
        message, text = params.message, _text(params.message)
        if message.task_id:
            run = await _call(runs.task_answer, principal, message.task_id, text, task_lookup=True)
            return run, run.last_seq
        exposed = await sync_to_async(exposed_for, thread_sensitive=False)(principal.tenant_id)
        target = _skill_of(message, context, exposed)
        meta = {"a2a": {"skill_id": target.skill_id, "card": target.card_name, "message_id": message.message_id}}
        run = await _call(
            runs.task_start,
            principal,
            agent=target.agent_name,
            text=text,
            session_id=message.context_id or None,
            metadata=meta,
        )
        return run, await admitted_from(run)

    async def _events(self, run_id: str, from_seq: int) -> AsyncGenerator[Event, None]:
        """Each committed text as an artifact chunk and each change of state, until the task is
        settled: the run ended (its stream ends), or it waits on its caller (the events up to
        the park are sent first). Committed text only (`live=False`): a live piece can still be
        voided (apps.runs.livemerge), and an appended artifact chunk cannot be taken back."""
        last, stop_at = "", None
        async with aclosing(run_frames(run_id, from_seq, keepalive_seconds(), live=False)) as frames:
            async for frame in frames:
                if frame.event == "text" and frame.data.get("text"):
                    chunk = Artifact(artifact_id=presenters.RESPONSE_ARTIFACT, parts=[Part(text=frame.data["text"])])
                    yield TaskArtifactUpdateEvent(task_id=run_id, artifact=chunk, append=True)
                if stop_at is None:
                    status, last_seq = await sync_to_async(runs.run_state, thread_sensitive=False)(run_id)
                    if status in presenters.WAITING:
                        stop_at = last_seq
                    elif status != last and status not in presenters.SETTLED:
                        last = status
                        yield presenters.status_event(await self._view(run_id))
                if stop_at is not None and (frame is KEEPALIVE or (frame.seq or 0) >= stop_at):
                    break
        yield presenters.status_event(await self._view(run_id))

    async def _view(self, run_id: str) -> presenters.RunView:
        return await sync_to_async(runs.run_view_unscoped, thread_sensitive=False)(run_id)

    async def _admit_holding(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[Run, int, StreamSlot]:
        """`_admit` for a request held open while its task runs: a stream slot first."""
        slot = await _slot(_allowed(context, "POST", "/v1/runs"))
        try:
            run, from_seq = await self._admit(params, context)
        except BaseException:
            await slot.release()  # no run was started: the slot was never held
            raise
        return run, from_seq, slot

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        principal = _principal(context)
        if params.configuration.return_immediately:
            run, _ = await self._admit(params, context)
        else:  # the request waits for the task to settle: it holds a stream slot as a stream does
            run, from_seq, slot = await self._admit_holding(params, context)
            async with slot.held(), aclosing(self._events(run.id, from_seq)) as events:
                async for _ in events:
                    pass
        return presenters.task(await _call(runs.run_view, principal, run.id, task_lookup=True))

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        run, from_seq, slot = await self._admit_holding(params, context)
        async with slot.held():
            yield presenters.task(await _call(runs.run_view, _principal(context), run.id, task_lookup=True))
            async with aclosing(self._events(run.id, from_seq)) as events:
                async for event in events:
                    yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        principal = _allowed(context, "GET", f"/v1/runs/{params.id}/stream")
        view = await _call(runs.run_view, principal, params.id, task_lookup=True)
        yield presenters.task(view)
        if view.status not in presenters.SETTLED:
            last_seq = await _call(runs.run_last_seq, principal, params.id, task_lookup=True)
            slot = await _slot(principal)
            async with slot.held(), aclosing(self._events(params.id, last_seq)) as events:
                async for event in events:
                    yield event

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        principal = _allowed(context, "GET", f"/v1/runs/{params.id}")
        return presenters.task(await _call(runs.run_view, principal, params.id, task_lookup=True))

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        principal = _allowed(context, "POST", f"/v1/runs/{params.id}/cancel")
        out = await _call(runs.task_cancel, principal, params.id, task_lookup=True)
        if not out["cancelled"]:
            raise TaskNotCancelableError(message=f"task {params.id} is {out['status']}: it has already ended")
        # A running run is cancelled when its worker next looks (within a second, DESIGN.md): the
        # answer is the task once it has ended, as the caller asked for an ended task.
        last_seq = await _call(runs.run_last_seq, principal, params.id, task_lookup=True)
        async with aclosing(self._events(params.id, last_seq)) as events:
            async for _ in events:
                pass
        return presenters.task(await _call(runs.run_view, principal, params.id, task_lookup=True))

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks is not served here; GET /v1/runs lists runs")

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        principal = _allowed(context, "POST", f"/v1/runs/{params.task_id}/input")
        try:
            ended = await _call(push.push_check, principal, params.task_id, params.url, task_lookup=True)
        except push.PushNotAllowed as exc:
            raise PushNotificationNotSupportedError(message=str(exc)) from exc
        out = await self._push.set_info(params.task_id, params, context)
        if ended:  # the run ended before the config came: push it now
            await sync_to_async(push.deliver_on_commit, thread_sensitive=False)(params.task_id)
        return out

    async def _push_configs(self, context: ServerCallContext, task_id: str) -> list[TaskPushNotificationConfig]:
        principal = _allowed(context, "GET", f"/v1/runs/{task_id}")
        await _call(runs.run_view, principal, task_id, task_lookup=True)  # 404 for another tenant's task
        return await self._push.get_info(task_id, context)

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        found = [c for c in await self._push_configs(context, params.task_id) if c.id == (params.id or params.task_id)]
        if not found:
            raise TaskNotFoundError(message=f"task {params.task_id} has no push notification config {params.id!r}")
        return found[0]

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        return ListTaskPushNotificationConfigsResponse(configs=await self._push_configs(context, params.task_id))

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        principal = _allowed(context, "POST", f"/v1/runs/{params.task_id}/input")
        await _call(runs.run_view, principal, params.task_id, task_lookup=True)
        await self._push.delete_info(params.task_id, context, params.id or None)

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError()


__all__ = ["A2AError", "RunsRequestHandler"]
