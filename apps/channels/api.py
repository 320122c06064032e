"""Channels REST (SPEC 2.7): runtime channel CRUD, publish / subscribe / peek /
ack on one stream, fan-in `_await`, fan-out `_broadcast`, system publish, and
the per-user routes.

Which stream a route reaches (it must be the one agents use):
- `/v1/_channels/{name}/...` (admin routes): the caller's tenant and the
  channel's declared scope with scope_id "" -- for `global` and `tenant`
  channels only. An `agent`- or `user`-scoped channel has one stream per
  agent / user, so these routes answer 400 `channel_scope_invalid` for it:
  user streams are reached through `/v1/users/{user_id}/channels/{name}/...`,
  `_await` / `_broadcast` take a `scope_id`.
- `/v1/users/{user_id}/channels/{name}/...`: channels declared `scope: user`;
  an isolated principal (substrate:user) may only name its own user id, any
  other is a 404 `unknown_channel`.

Channel names contain `/`, so names are `{path:name}` and the suffix routes
are registered before the bare `/v1/_channels/{name}` route; a runtime
channel whose name ends in a suffix (`jobs/ack`) still reaches PATCH, DELETE
and system publish through hidden fall-through operations.

Long-poll (`wait_ms`): the reader subscribes to the channel's doorbell
(`services.bell`) BEFORE its first read, then re-reads on every ring and at
least every second (a deferred message becomes visible without a ring) until
it has messages or the wait is over; a timeout is a 200 with no messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router
from pydantic import BaseModel

from apps.channels import services
from apps.channels.schemas import (
    ChannelAckIn,
    ChannelAwaitIn,
    ChannelBroadcastIn,
    ChannelCreateIn,
    ChannelPublishIn,
    ChannelSubscribeIn,
    ChannelUpdateIn,
)
from apps.channels.services import ChannelNotDeclared, ChannelScopeInvalid, NonSystemChannel, Stream
from apps.core.errors import ApplicationError, Invalid, NotFound
from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.core.pubsub import hub
from apps.core.types import Principal
from apps.substrate.kinds import Refused
from apps.substrate.kinds_admin.fields import check_channel_name, is_system_channel
from apps.substrate.models import ChannelDef, ChannelScope, DefSource

router = Router(tags=["channels"])

ADMIN = "_admin"  # published_by / published_by_user_id of operator publishes (SPEC 9.4)
RESERVED_NAMES = frozenset({"_await", "_broadcast"})  # route names under /v1/_channels/
REPOLL_S = 1.0
MAX_SCOPE_ID = 256
_PREFIX = "/_channels/{path:name}"
_USER_PREFIX = "/users/{user_id}/channels/{path:name}"


class SystemScopeUnsupported(ApplicationError):
    status, code = 501, "channel_scope_unsupported"


class UnknownChannel(NotFound):
    code = "unknown_channel"


# --- helpers ----------------------------------------------------------------------


def _json(data: dict[str, Any], status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status)


def body_bytes() -> int:
    """A body holds one payload plus a few fields: room for the payload cap, so an
    oversized payload is the specific 413 channel_value_too_large."""
    return max(1 << 20, settings.LOOMCYCLE.channels_max_value_bytes + 65_536)


def _body(request: HttpRequest, schema: type[BaseModel], *, required: bool = True) -> Any:
    return parse_body(request, schema, max_bytes=body_bytes(), required=required)


def check_cursor(raw: Any) -> str | None:
    """A from_cursor as the services take it (None: not given); 400 invalid_cursor."""
    services.decode_cursor(raw)
    return raw if isinstance(raw, str) else None


def _wait_ms(raw: int | None) -> int:
    """The requested wait, cut to the operator's cap (0: do not wait)."""
    return min(raw or 0, max(settings.LOOMCYCLE.channels_longpoll_cap_ms, 0))


def _scope_id_for(name: str, declared: ChannelDef, scope_id: str) -> str:
    if declared.scope not in (ChannelScope.USER, ChannelScope.AGENT):
        return ""
    what = "user id" if declared.scope == ChannelScope.USER else "agent name"
    if not scope_id:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope={declared.scope}: give scope_id (the {what}) to reach one of its streams'
        )
    if len(scope_id) > MAX_SCOPE_ID or (declared.scope == ChannelScope.USER and not is_ident(scope_id)):
        raise Invalid(f"invalid scope_id {scope_id[:40]!r} for scope={declared.scope}", code="invalid_scope_id")
    return scope_id


def admin_stream(principal: Principal, name: str) -> tuple[Stream, ChannelDef]:
    """The stream of a global/tenant channel in the caller's tenant."""
    declared = services.channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.scope == ChannelScope.USER:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope=user (one stream per user): use /v1/users/{{user_id}}/channels/{name}/...'
        )
    if declared.scope == ChannelScope.AGENT:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope=agent (one stream per agent): only `_await` and `_broadcast` with '
            "scope_id=<agent name> reach its streams over REST"
        )
    return Stream(principal.tenant_id, name, declared.scope, ""), declared


def user_stream(principal: Principal, user_id: str, name: str) -> tuple[Stream, ChannelDef]:
    if not is_ident(user_id):
        raise Invalid("invalid user_id: must match [A-Za-z0-9_-]{1,128}", code="invalid_user_id")
    own = principal.read_user
    if own is not None and own != user_id:  # an isolated member sees only its own streams: no oracle
        raise UnknownChannel(f'unknown channel "{name}"')
    declared = services.channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.scope != ChannelScope.USER:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope={declared.scope}, not user: use /v1/_channels/{name}/... instead'
        )
    return Stream(principal.tenant_id, name, ChannelScope.USER, user_id), declared


def _fanout_stream(principal: Principal, name: str, scope: str, scope_id: str) -> tuple[Stream, ChannelDef]:
    declared = services.channel_get(tenant_id=principal.tenant_id, name=name)
    if scope and scope != declared.scope:
        raise ChannelScopeInvalid(f'channel "{name}" is declared with scope={declared.scope}, not {scope}')
    return Stream(principal.tenant_id, name, declared.scope, _scope_id_for(name, declared, scope_id)), declared


def _payload(body: ChannelPublishIn | ChannelBroadcastIn, op: str) -> Any:
    if "payload" not in body.model_fields_set or body.payload is None:
        raise Invalid(f"{op}: missing required field: payload (any JSON value but null)", code="missing_payload")
    return body.payload


def _publish(stream: Stream, declared: ChannelDef, body: ChannelPublishIn, by_user: str) -> dict[str, Any]:
    value = _payload(body, "publish")
    done = services.publish(
        stream=stream,
        declared=declared,
        value=value,
        ttl=body.ttl,
        deliver_at=services.parse_deliver_at(body.deliver_at),
        published_by=ADMIN,
        published_by_user_id=by_user,
    )
    return done.as_rest()


async def _long_poll(
    bells: list[str], wait_ms: int, attempt: Callable[[bool], Awaitable[tuple[bool, dict[str, Any]]]]
) -> dict[str, Any]:
    """`attempt(final)` until it is satisfied or the wait is over (its last call
    gets final=True). Doorbells are subscribed before the first attempt and
    released however the request ends (a client hang-up cancels this task)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    bus = hub()
    queues: list[tuple[str, asyncio.Queue[str]]] = []
    try:
        if wait_ms > 0:
            for name in dict.fromkeys(bells):
                queues.append((name, await bus.subscribe(name)))
        while True:
            final = loop.time() >= deadline
            satisfied, out = await attempt(final)
            if satisfied or final:
                return out
            await _ring(queues, min(deadline - loop.time(), REPOLL_S))
    finally:
        for name, queue in queues:
            await bus.unsubscribe(name, queue)


async def _ring(queues: list[tuple[str, asyncio.Queue[str]]], timeout: float) -> None:
    """Wait for any doorbell (or the timeout), then empty every queue: the
    next attempt re-reads Postgres, so one ring per wait is enough."""
    if timeout > 0 and not queues:
        await asyncio.sleep(timeout)
    elif timeout > 0:
        getters = [asyncio.ensure_future(queue.get()) for _, queue in queues]
        try:
            await asyncio.wait(getters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for getter in getters:
                getter.cancel()
    for _, queue in queues:
        while not queue.empty():
            queue.get_nowait()


async def _subscribe(stream: Stream, body: ChannelSubscribeIn) -> dict[str, Any]:
    from_cursor = check_cursor(body.from_cursor)
    limit = services.clamp_max(body.max_messages)
    read = db_call(services.subscribe)

    async def attempt(final: bool) -> tuple[bool, dict[str, Any]]:
        got = await read(stream=stream, from_cursor=from_cursor, max_messages=limit)
        return bool(got.messages), got.as_result()

    return await _long_poll([services.bell(stream.tenant_id, stream.channel)], _wait_ms(body.wait_ms), attempt)


def _peek(stream: Stream, from_cursor: str | None, max_raw: str | None) -> dict[str, Any]:
    read = services.peek(stream=stream, from_cursor=from_cursor, max_messages=_query_max(max_raw))
    return {"channel": stream.channel, "messages": read.messages}


def _query_max(raw: str | None) -> int:
    if raw is None or raw == "":
        return services.clamp_max(None)
    try:
        return services.clamp_max(int(raw))
    except ValueError as exc:
        raise Invalid("max_messages must be an integer", code="invalid_max_messages") from exc


def _query_cursor(request: HttpRequest) -> str | None:
    return check_cursor(request.GET.get("from_cursor"))


# --- declarations -----------------------------------------------------------------


def _list(principal: Principal) -> dict[str, Any]:
    tenant = principal.tenant_id
    return {"channels": [services.descriptor(r, tenant_id=tenant) for r in services.channels_visible(tenant_id=tenant)]}


def _create(principal: Principal, body: ChannelCreateIn) -> dict[str, Any]:
    try:
        name = check_channel_name(body.name, "name")
    except Refused as exc:
        raise Invalid(exc.message, code="invalid_channel_name") from exc
    if is_system_channel(name) or name in RESERVED_NAMES:
        raise Invalid(
            f'channel name "{name}" is reserved (`_system/` channels are declared in yaml with `publisher: system`)',
            code="channel_name_reserved",
        )
    if len(body.publisher) > 32 or len(body.period) > 64:
        raise Invalid("publisher is at most 32 characters, period at most 64", code="invalid_body")
    spec = services.ChannelSpec(
        description=body.description,
        scope=body.scope,
        semantic=body.semantic,
        default_ttl=body.default_ttl,
        max_messages=body.max_messages,
        publisher=body.publisher,
        period=body.period,
    )
    row = services.channel_create(tenant_id=principal.tenant_id, name=name, spec=spec)
    return services.descriptor(row, tenant_id=principal.tenant_id)


def _update(principal: Principal, name: str, body: ChannelUpdateIn) -> dict[str, Any]:
    row = services.channel_update(tenant_id=principal.tenant_id, name=name, changes=body.model_dump())
    return services.descriptor(row, tenant_id=principal.tenant_id)


def _system_publish(principal: Principal, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    if not is_system_channel(name):
        raise NonSystemChannel(
            f'channel "{name}" is not a system channel: POST /v1/_channels/{{name}} publishes to `_system/` '
            "channels only (use POST /v1/_channels/{name}/publish)"
        )
    declared = services.channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.source != DefSource.YAML:
        raise ChannelNotDeclared(f'system channel "{name}" is not declared in yaml `channels:`')
    if declared.scope in (ChannelScope.USER, ChannelScope.AGENT):
        raise SystemScopeUnsupported(f"system publish to a scope={declared.scope} channel is not supported")
    stream = Stream(principal.tenant_id, name, declared.scope, "")
    return _publish(stream, declared, body, ADMIN)


@router.get("/_channels", operation_id="channels_list", summary="Channels visible to the tenant (yaml + runtime)")
async def channels_list(request: HttpRequest) -> JsonResponse:
    return _json(await db_call(_list)(request_principal(request)))


@router.post(
    "/_channels",
    operation_id="channel_create",
    summary="Create a runtime channel; 201 descriptor; 409 channel_yaml_immutable / channel_name_in_use",
    openapi_extra=openapi_body(ChannelCreateIn),
)
async def channel_create(request: HttpRequest) -> JsonResponse:
    body = _body(request, ChannelCreateIn)
    return _json(await db_call(_create)(request_principal(request), body), status=201)


# --- fan-in / fan-out (before the {name} routes: these are not channel names) --------


def _await_streams(principal: Principal, body: ChannelAwaitIn) -> list[tuple[Stream, str | None]]:
    names = services.dedupe(body.channels, "await: ")
    from_cursor = check_cursor(body.from_cursor)
    return [(_fanout_stream(principal, n, body.scope, body.scope_id)[0], from_cursor) for n in names]


@router.post(
    "/_channels/_await",
    operation_id="channels_await",
    summary="Wait for messages on several channels (mode any|all|at_least, never commits); a timeout is a 200",
    openapi_extra=openapi_body(ChannelAwaitIn),
)
async def channels_await(request: HttpRequest) -> JsonResponse:
    body: ChannelAwaitIn = _body(request, ChannelAwaitIn)
    principal = request_principal(request)
    checked = services.check_await(body.mode, body.n, "await: ")
    spec = services.AwaitSpec(checked.mode, checked.n, services.clamp_max(body.max_messages))
    streams = await db_call(_await_streams)(principal, body)
    read = db_call(services.await_read)

    async def attempt(final: bool) -> tuple[bool, dict[str, Any]]:
        return await read(streams=streams, spec=spec, timed_out=final)

    bells = [services.bell(s.tenant_id, s.channel) for s, _ in streams]
    return _json(await _long_poll(bells, _wait_ms(body.wait_ms), attempt))


def _broadcast(principal: Principal, body: ChannelBroadcastIn) -> dict[str, Any]:
    names = services.dedupe(body.channels, "broadcast: ")
    value = _payload(body, "broadcast")
    # Every target is resolved first: one undeclared channel and nothing is published.
    targets = [_fanout_stream(principal, n, body.scope, body.scope_id) for n in names]
    services.check_payload(value)
    outcomes = services.broadcast(
        targets=targets,
        value=value,
        ttl=body.ttl,
        deliver_at=services.parse_deliver_at(body.deliver_at),
        published_by=ADMIN,
        published_by_user_id=ADMIN,
    )
    results = [  # a failure is reported per channel, as loomcycle does
        {"channel": stream.channel, "error": o.message, "code": o.code}
        if isinstance(o, ApplicationError)
        else o.as_rest()
        for stream, o in outcomes
    ]
    failed = sum(1 for r in results if "error" in r)
    return {"published": len(results) - failed, "failed": failed, "results": results}


@router.post(
    "/_channels/_broadcast",
    operation_id="channels_broadcast",
    summary="Publish one payload to several channels; one undeclared channel: 404 and nothing is published",
    openapi_extra=openapi_body(ChannelBroadcastIn),
)
async def channels_broadcast(request: HttpRequest) -> JsonResponse:
    body = _body(request, ChannelBroadcastIn)
    return _json(await db_call(_broadcast)(request_principal(request), body))


# --- one stream (admin routes) ------------------------------------------------------


def _admin_publish(principal: Principal, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    stream, declared = admin_stream(principal, name)
    return _publish(stream, declared, body, ADMIN)


@router.post(
    _PREFIX + "/publish",
    operation_id="channel_publish",
    summary="Publish {payload, deliver_at?, ttl?} to a global/tenant channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def channel_publish(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelPublishIn)
    return _json(await db_call(_admin_publish)(request_principal(request), name, body))


@router.post(
    _PREFIX + "/subscribe",
    operation_id="channel_subscribe",
    summary="Read after the committed cursor (or from_cursor) and commit it; wait_ms long-polls",
    openapi_extra=openapi_body(ChannelSubscribeIn),
)
async def channel_subscribe(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelSubscribeIn, required=False)
    stream, _ = await db_call(admin_stream)(request_principal(request), name)
    return _json(await _subscribe(stream, body))


def _admin_ack(principal: Principal, name: str, cursor: Any) -> dict[str, Any]:
    return services.ack(stream=admin_stream(principal, name)[0], cursor=cursor)


@router.post(
    _PREFIX + "/ack",
    operation_id="channel_ack",
    summary="Commit {cursor}; 409 channel_cursor_regression when older than the committed one",
    openapi_extra=openapi_body(ChannelAckIn),
)
async def channel_ack(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelAckIn)
    return _json(await db_call(_admin_ack)(request_principal(request), name, body.cursor))


def _purge(principal: Principal, name: str) -> dict[str, Any]:
    return services.channel_purge(tenant_id=principal.tenant_id, name=name)


@router.post(_PREFIX + "/purge", operation_id="channel_purge", summary="Drop every message of the channel")
async def channel_purge(request: HttpRequest, name: str) -> JsonResponse:
    return _json(await db_call(_purge)(request_principal(request), name))


def _admin_peek(principal: Principal, name: str, from_cursor: str | None, max_raw: str | None) -> dict[str, Any]:
    return _peek(admin_stream(principal, name)[0], from_cursor, max_raw)


@router.get(
    _PREFIX + "/peek",
    operation_id="channel_peek",
    summary="Non-committing read (?from_cursor, default from the oldest; ?max_messages)",
)
async def channel_peek(request: HttpRequest, name: str) -> JsonResponse:
    principal, from_cursor = request_principal(request), _query_cursor(request)
    return _json(await db_call(_admin_peek)(principal, name, from_cursor, request.GET.get("max_messages")))


# --- the bare {name} route: update, delete, system publish --------------------------


async def _patch(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelUpdateIn)
    return _json(await db_call(_update)(request_principal(request), name, body))


async def _delete(request: HttpRequest, name: str) -> HttpResponse:
    await db_call(services.channel_delete)(tenant_id=request_principal(request).tenant_id, name=name)
    return HttpResponse(status=204)


async def _system(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelPublishIn)
    return _json(await db_call(_system_publish)(request_principal(request), name, body))


_BARE: dict[str, Callable[[HttpRequest, str], Awaitable[HttpResponse]]] = {
    "PATCH": _patch,
    "DELETE": _delete,
    "POST": _system,
}


def _fall_through(suffix: str, methods: list[str]) -> None:
    """`/_channels/<name>/<suffix>` with a method the suffix route lacks is the
    bare route of the channel named `<name>/<suffix>`."""

    async def view(request: HttpRequest, name: str) -> HttpResponse:
        return await _BARE[request.method or ""](request, f"{name}/{suffix}")

    view.__name__ = f"channel_{suffix}_fall_through"
    router.add_api_operation(f"{_PREFIX}/{suffix}", methods, view, include_in_schema=False)


for _suffix in ("publish", "subscribe", "ack", "purge"):
    _fall_through(_suffix, ["PATCH", "DELETE"])
_fall_through("peek", ["PATCH", "DELETE", "POST"])


@router.patch(
    _PREFIX,
    operation_id="channel_update",
    summary="Update a runtime channel {description, semantic, default_ttl, max_messages}; 409 for yaml ones",
    openapi_extra=openapi_body(ChannelUpdateIn),
)
async def channel_update(request: HttpRequest, name: str) -> JsonResponse:
    return await _patch(request, name)


@router.delete(_PREFIX, operation_id="channel_delete", summary="Delete a runtime channel and its messages (204)")
async def channel_delete(request: HttpRequest, name: str) -> HttpResponse:
    return await _delete(request, name)


@router.post(
    _PREFIX,
    operation_id="channel_system_publish",
    summary="System publish {payload, deliver_at?, ttl?} to a yaml-declared `_system/` channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def channel_system_publish(request: HttpRequest, name: str) -> JsonResponse:
    return await _system(request, name)


# --- per-user streams ---------------------------------------------------------------


def _user_publish(principal: Principal, user_id: str, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    stream, declared = user_stream(principal, user_id, name)
    return _publish(stream, declared, body, principal.read_user or ADMIN)


@router.post(
    _USER_PREFIX + "/publish",
    operation_id="user_channel_publish",
    summary="Publish to the user's stream of a scope=user channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def user_channel_publish(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    body = _body(request, ChannelPublishIn)
    return _json(await db_call(_user_publish)(request_principal(request), user_id, name, body))


@router.post(
    _USER_PREFIX + "/subscribe",
    operation_id="user_channel_subscribe",
    summary="Subscribe to the user's stream (commits its cursor; wait_ms long-polls)",
    openapi_extra=openapi_body(ChannelSubscribeIn),
)
async def user_channel_subscribe(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    body = _body(request, ChannelSubscribeIn, required=False)
    stream, _ = await db_call(user_stream)(request_principal(request), user_id, name)
    return _json(await _subscribe(stream, body))


def _user_ack(principal: Principal, user_id: str, name: str, cursor: Any) -> dict[str, Any]:
    return services.ack(stream=user_stream(principal, user_id, name)[0], cursor=cursor)


@router.post(
    _USER_PREFIX + "/ack",
    operation_id="user_channel_ack",
    summary="Commit {cursor} on the user's stream",
    openapi_extra=openapi_body(ChannelAckIn),
)
async def user_channel_ack(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    body = _body(request, ChannelAckIn)
    return _json(await db_call(_user_ack)(request_principal(request), user_id, name, body.cursor))


def _user_peek(
    principal: Principal, user_id: str, name: str, from_cursor: str | None, max_raw: str | None
) -> dict[str, Any]:
    return _peek(user_stream(principal, user_id, name)[0], from_cursor, max_raw)


@router.get(
    _USER_PREFIX + "/peek", operation_id="user_channel_peek", summary="Non-committing read of the user's stream"
)
async def user_channel_peek(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    principal, from_cursor = request_principal(request), _query_cursor(request)
    max_raw = request.GET.get("max_messages")
    return _json(await db_call(_user_peek)(principal, user_id, name, from_cursor, max_raw))
