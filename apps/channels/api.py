"""Channels REST (SPEC 2.7): runtime channel CRUD, publish / subscribe / peek /
ack on one stream, fan-in `_await`, fan-out `_broadcast`, system publish, and
the per-user routes. Each operation parses, calls `access` (which stream),
the services / selectors, and answers with `presenters`; `access` documents
which stream a route reaches, `longpoll` how `wait_ms` waits.

Channel names contain `/`, so names are `{path:name}` and the suffix routes
are registered before the bare `/v1/_channels/{name}` route; a runtime
channel whose name ends in a suffix (`jobs/ack`) still reaches PATCH, DELETE
and system publish through hidden fall-through operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router
from pydantic import BaseModel

from apps.channels import access, cursors, presenters, schemas, selectors, services, verbs
from apps.channels.longpoll import subscribe_waiting
from apps.channels.schemas import (
    ChannelAckIn,
    ChannelAwaitIn,
    ChannelBroadcastIn,
    ChannelCreateIn,
    ChannelPublishIn,
    ChannelSubscribeIn,
    ChannelUpdateIn,
)
from apps.channels.streams import Stream, check_cursor
from apps.core.errors import Invalid
from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.core.numbers import parse_count
from apps.core.types import Principal

router = Router(tags=["channels"])

_PREFIX = "/_channels/{path:name}"
_USER_PREFIX = "/users/{user_id}/channels/{path:name}"


# --- helpers ----------------------------------------------------------------------


def _json(data: dict[str, Any], status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status)


def body_bytes() -> int:
    """A body holds one payload plus a few fields: room for the payload cap, so an
    oversized payload is the specific 413 channel_value_too_large."""
    return max(1 << 20, settings.LOOMCYCLE.channels_max_value_bytes + 65_536)


def _body(request: HttpRequest, schema: type[BaseModel], *, required: bool = True) -> Any:
    return parse_body(request, schema, max_bytes=body_bytes(), required=required)


def _publish(target: access.Target, body: ChannelPublishIn, by_user: str) -> dict[str, Any]:
    return verbs.publish(target, value=body.payload, ttl=body.ttl, deliver_at=body.deliver_at, by_user=by_user)


async def _subscribe(stream: Stream, body: ChannelSubscribeIn) -> dict[str, Any]:
    read = await subscribe_waiting(
        stream=stream, from_cursor=body.from_cursor, max_messages=body.max_messages, wait_ms=body.wait_ms
    )
    return presenters.read_result(read)


def _peek(stream: Stream, from_cursor: str | None, max_raw: str | None) -> dict[str, Any]:
    read = selectors.peek(stream=stream, from_cursor=from_cursor, max_messages=_query_max(max_raw))
    return presenters.peek_result(read)


def _query_max(raw: str | None) -> int:
    if raw is None or raw == "":
        return selectors.clamp_max(None)
    value = parse_count(raw)
    if value is None:
        raise Invalid("max_messages must be a non-negative integer", code="invalid_max_messages")
    return selectors.clamp_max(value)


def _query_cursor(request: HttpRequest) -> str | None:
    return check_cursor(request.GET.get("from_cursor"))


# --- declarations -----------------------------------------------------------------


def _list(principal: Principal) -> dict[str, Any]:
    return {"channels": verbs.channel_list(principal)}


def _create(principal: Principal, body: ChannelCreateIn) -> dict[str, Any]:
    return verbs.channel_create(principal, body)


def _update(principal: Principal, name: str, body: ChannelUpdateIn) -> dict[str, Any]:
    return verbs.channel_update(principal, name, body.model_dump())


def _system_publish(principal: Principal, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    return _publish(access.system_stream(principal, name), body, access.ADMIN)


@router.get(
    "/_channels",
    response=schemas.ChannelsOut,
    operation_id="channels_list",
    summary="Channels visible to the tenant (yaml + runtime)",
)
async def channels_list(request: HttpRequest) -> JsonResponse:
    return _json(await db_call(_list)(request_principal(request)))


@router.post(
    "/_channels",
    response={201: schemas.ChannelOut},
    operation_id="channel_create",
    summary="Create a runtime channel; 201 descriptor; 409 channel_yaml_immutable / channel_name_in_use",
    openapi_extra=openapi_body(ChannelCreateIn),
)
async def channel_create(request: HttpRequest) -> JsonResponse:
    body = _body(request, ChannelCreateIn)
    return _json(await db_call(_create)(request_principal(request), body), status=201)


# --- fan-in / fan-out (before the {name} routes: these are not channel names) --------


@router.post(
    "/_channels/_await",
    response=schemas.ChannelAwaitOut,
    operation_id="channels_await",
    summary="Wait for messages on several channels (mode any|all|at_least, never commits); a timeout is a 200",
    openapi_extra=openapi_body(ChannelAwaitIn),
)
async def channels_await(request: HttpRequest) -> JsonResponse:
    body: ChannelAwaitIn = _body(request, ChannelAwaitIn)
    out = await verbs.await_waiting(
        request_principal(request),
        channels=body.channels,
        scope=body.scope,
        scope_id=body.scope_id,
        from_cursor=body.from_cursor,
        mode=body.mode,
        n=body.n,
        max_messages=body.max_messages,
        wait_ms=body.wait_ms,
    )
    return _json(out)


def _broadcast(principal: Principal, body: ChannelBroadcastIn) -> dict[str, Any]:
    return verbs.broadcast(
        principal,
        channels=body.channels,
        scope=body.scope,
        scope_id=body.scope_id,
        value=body.payload,
        ttl=body.ttl,
        deliver_at=body.deliver_at,
    )


@router.post(
    "/_channels/_broadcast",
    response=schemas.ChannelBroadcastOut,
    operation_id="channels_broadcast",
    summary="Publish one payload to several channels; one undeclared channel: 404 and nothing is published",
    openapi_extra=openapi_body(ChannelBroadcastIn),
)
async def channels_broadcast(request: HttpRequest) -> JsonResponse:
    body = _body(request, ChannelBroadcastIn)
    return _json(await db_call(_broadcast)(request_principal(request), body))


# --- one stream (admin routes) ------------------------------------------------------


def _admin_publish(principal: Principal, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    return _publish(access.admin_stream(principal, name), body, access.ADMIN)


@router.post(
    _PREFIX + "/publish",
    response=schemas.ChannelPublishedOut,
    operation_id="channel_publish",
    summary="Publish {payload, deliver_at?, ttl?} to a global/tenant channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def channel_publish(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelPublishIn)
    return _json(await db_call(_admin_publish)(request_principal(request), name, body))


@router.post(
    _PREFIX + "/subscribe",
    response=schemas.ChannelReadOut,
    operation_id="channel_subscribe",
    summary="Read after the committed cursor (or from_cursor) and commit it; wait_ms long-polls",
    openapi_extra=openapi_body(ChannelSubscribeIn),
)
async def channel_subscribe(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelSubscribeIn, required=False)
    stream, _ = await db_call(access.admin_stream)(request_principal(request), name)
    return _json(await _subscribe(stream, body))


def _admin_ack(principal: Principal, name: str, cursor: Any) -> dict[str, Any]:
    return cursors.ack(stream=access.admin_stream(principal, name)[0], cursor=cursor)


@router.post(
    _PREFIX + "/ack",
    response=schemas.ChannelAckOut,
    operation_id="channel_ack",
    summary="Commit {cursor}; 409 channel_cursor_regression when older than the committed one",
    openapi_extra=openapi_body(ChannelAckIn),
)
async def channel_ack(request: HttpRequest, name: str) -> JsonResponse:
    body = _body(request, ChannelAckIn)
    return _json(await db_call(_admin_ack)(request_principal(request), name, body.cursor))


def _purge(principal: Principal, name: str) -> dict[str, Any]:
    return services.channel_purge(tenant_id=principal.tenant_id, name=name)


@router.post(
    _PREFIX + "/purge",
    response=schemas.ChannelPurgedOut,
    operation_id="channel_purge",
    summary="Drop every message of the channel",
)
async def channel_purge(request: HttpRequest, name: str) -> JsonResponse:
    return _json(await db_call(_purge)(request_principal(request), name))


def _admin_peek(principal: Principal, name: str, from_cursor: str | None, max_raw: str | None) -> dict[str, Any]:
    return _peek(access.admin_stream(principal, name)[0], from_cursor, max_raw)


@router.get(
    _PREFIX + "/peek",
    response=schemas.ChannelPeekOut,
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
    response=schemas.ChannelOut,
    operation_id="channel_update",
    summary="Update a runtime channel {description, semantic, default_ttl, max_messages}; 409 for yaml ones",
    openapi_extra=openapi_body(ChannelUpdateIn),
)
async def channel_update(request: HttpRequest, name: str) -> JsonResponse:
    return await _patch(request, name)


@router.delete(
    _PREFIX,
    response={204: None},
    operation_id="channel_delete",
    summary="Delete a runtime channel and its messages (204)",
)
async def channel_delete(request: HttpRequest, name: str) -> HttpResponse:
    return await _delete(request, name)


@router.post(
    _PREFIX,
    response=schemas.ChannelPublishedOut,
    operation_id="channel_system_publish",
    summary="System publish {payload, deliver_at?, ttl?} to a yaml-declared `_system/` channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def channel_system_publish(request: HttpRequest, name: str) -> JsonResponse:
    return await _system(request, name)


# --- per-user streams ---------------------------------------------------------------


def _user_publish(principal: Principal, user_id: str, name: str, body: ChannelPublishIn) -> dict[str, Any]:
    return _publish(access.user_stream(principal, user_id, name), body, access.user_publisher(principal))


@router.post(
    _USER_PREFIX + "/publish",
    response=schemas.ChannelPublishedOut,
    operation_id="user_channel_publish",
    summary="Publish to the user's stream of a scope=user channel",
    openapi_extra=openapi_body(ChannelPublishIn),
)
async def user_channel_publish(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    body = _body(request, ChannelPublishIn)
    return _json(await db_call(_user_publish)(request_principal(request), user_id, name, body))


@router.post(
    _USER_PREFIX + "/subscribe",
    response=schemas.ChannelReadOut,
    operation_id="user_channel_subscribe",
    summary="Subscribe to the user's stream (commits its cursor; wait_ms long-polls)",
    openapi_extra=openapi_body(ChannelSubscribeIn),
)
async def user_channel_subscribe(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    body = _body(request, ChannelSubscribeIn, required=False)
    stream, _ = await db_call(access.user_stream)(request_principal(request), user_id, name)
    return _json(await _subscribe(stream, body))


def _user_ack(principal: Principal, user_id: str, name: str, cursor: Any) -> dict[str, Any]:
    return cursors.ack(stream=access.user_stream(principal, user_id, name)[0], cursor=cursor)


@router.post(
    _USER_PREFIX + "/ack",
    response=schemas.ChannelAckOut,
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
    return _peek(access.user_stream(principal, user_id, name)[0], from_cursor, max_raw)


@router.get(
    _USER_PREFIX + "/peek",
    response=schemas.ChannelPeekOut,
    operation_id="user_channel_peek",
    summary="Non-committing read of the user's stream",
)
async def user_channel_peek(request: HttpRequest, user_id: str, name: str) -> JsonResponse:
    principal, from_cursor = request_principal(request), _query_cursor(request)
    max_raw = request.GET.get("max_messages")
    return _json(await db_call(_user_peek)(principal, user_id, name, from_cursor, max_raw))
