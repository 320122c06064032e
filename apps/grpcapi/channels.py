"""The channel RPCs, over what the /v1/_channels and /v1/users/{id}/channels routes call
(apps.channels access, services, selectors, presenters and the long-poll): a `scope: "user"`
request is the user's stream (`scope_id` = the user: channel:read / channel:publish, as
/v1/users/{id}/channels/…), any other the global/tenant stream (/v1/_channels/…: the tenant
plane). Payloads travel as JSON bytes; a message's `value` likewise."""

from __future__ import annotations

import json
from typing import Any

from apps.channels import access, cursors, selectors, verbs
from apps.channels.longpoll import subscribe_waiting
from apps.channels.streams import Stream, check_cursor
from apps.core.errors import Invalid
from apps.core.http import db_call, loads_checked
from apps.core.types import Principal
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import Route, unary


def _route(action: str, method: str = "POST") -> Any:
    def route(request: Any) -> Route:
        if request.scope == "user":
            return (method, f"/v1/users/x/channels/x/{action}")
        return (method, f"/v1/_channels/x/{action}")

    return route


def _target(principal: Principal, request: Any) -> access.Target:
    if not request.channel:
        raise Invalid("channel is required", code="missing_name")
    if request.scope == "user":
        return access.user_stream(principal, request.scope_id, request.channel)
    return access.admin_stream(principal, request.channel)


def _stream(principal: Principal, request: Any) -> Stream:
    return _target(principal, request)[0]


def _payload(raw: bytes) -> Any:
    """The request's JSON payload; None when it carries none (the verb refuses it)."""
    return loads_checked(raw) if raw else None


def _publish(principal: Principal, request: pb.PublishChannelRequest) -> dict[str, Any]:
    target = _target(principal, request)
    by = access.user_publisher(principal) if request.scope == "user" else access.ADMIN
    # PublishChannelRequest carries no ttl: the channel's default_ttl.
    value = _payload(request.payload)
    return verbs.publish(target, value=value, ttl=None, deliver_at=request.deliver_at or None, by_user=by)


def _messages(messages: list[dict[str, Any]]) -> list[pb.ChannelMessage]:
    return [
        pb.ChannelMessage(id=m["id"], value=json.dumps(m["value"]).encode(), published_at=m["published_at"] or "")
        for m in messages
    ]


def _max(value: int) -> int:
    return selectors.clamp_max(value or None)


def _list(principal: Principal) -> list[pb.ChannelDescriptor]:
    return [_descriptor(d) for d in verbs.channel_list(principal)]


def _descriptor(d: dict[str, Any]) -> pb.ChannelDescriptor:
    return pb.ChannelDescriptor(
        name=d["name"],
        scope=d["scope"],
        semantic=d["semantic"],
        publisher=d["publisher"] or "",
        period=d["period"] or "",
        description=d["description"] or "",
        source=d["source"] or "",
        newest_visible_at=d["newest_visible_at"] or "",
        max_messages=d["max_messages"],
        default_ttl=d["default_ttl"],
        message_count=d["message_count"],
    )


def _broadcast(principal: Principal, request: pb.BroadcastChannelsRequest) -> dict[str, Any]:
    return verbs.broadcast(
        principal,
        channels=list(request.channels),
        scope=request.scope,
        scope_id=request.scope_id,
        value=_payload(request.payload),
        ttl=None,  # the channel's default_ttl: BroadcastChannelsRequest carries none
        deliver_at=request.deliver_at or None,
    )


def _broadcast_entry(r: dict[str, Any]) -> pb.BroadcastChannelEntry:
    return pb.BroadcastChannelEntry(
        channel=r["channel"],
        msg_id=r.get("msg_id", ""),
        created_at=r.get("created_at") or "",
        visible_at=r.get("visible_at") or "",
        error=r.get("error", ""),
    )


class ChannelRpcs:
    @unary(("GET", "/v1/_channels"))
    async def ListChannels(self, request: pb.ListChannelsRequest, principal: Principal) -> pb.ListChannelsResponse:
        return pb.ListChannelsResponse(channels=await db_call(_list)(principal))

    @unary(_route("publish"))
    async def PublishChannel(
        self, request: pb.PublishChannelRequest, principal: Principal
    ) -> pb.PublishChannelResponse:
        out = await db_call(_publish)(principal, request)
        return pb.PublishChannelResponse(
            msg_id=out["msg_id"],
            channel=out["channel"],
            created_at=out["created_at"] or "",
            visible_at=out.get("visible_at") or "",
            dropped_oldest=out["dropped_oldest"],
        )

    @unary(_route("subscribe"))
    async def SubscribeChannel(
        self, request: pb.SubscribeChannelRequest, principal: Principal
    ) -> pb.SubscribeChannelResponse:
        stream = await db_call(_stream)(principal, request)
        got = await subscribe_waiting(
            stream=stream,
            from_cursor=request.from_cursor or None,
            max_messages=request.max_messages or None,
            wait_ms=request.wait_ms,
        )
        return pb.SubscribeChannelResponse(
            channel=stream.channel, messages=_messages(got.messages), next_cursor=got.next_cursor or ""
        )

    @unary(_route("peek", "GET"))
    async def PeekChannel(self, request: pb.PeekChannelRequest, principal: Principal) -> pb.PeekChannelResponse:
        stream = await db_call(_stream)(principal, request)
        cursor, limit = check_cursor(request.from_cursor or None), _max(request.max_messages)
        got = await db_call(selectors.peek)(stream=stream, from_cursor=cursor, max_messages=limit)
        return pb.PeekChannelResponse(channel=stream.channel, messages=_messages(got.messages))

    @unary(_route("ack"))
    async def AckChannel(self, request: pb.AckChannelRequest, principal: Principal) -> pb.AckChannelResponse:
        stream = await db_call(_stream)(principal, request)
        await db_call(cursors.ack)(stream=stream, cursor=request.cursor or None)
        return pb.AckChannelResponse(ok=True)

    @unary(("POST", "/v1/_channels/_broadcast"))
    async def BroadcastChannels(
        self, request: pb.BroadcastChannelsRequest, principal: Principal
    ) -> pb.BroadcastChannelsResponse:
        out = await db_call(_broadcast)(principal, request)
        results = [_broadcast_entry(r) for r in out["results"]]
        return pb.BroadcastChannelsResponse(published=out["published"], failed=out["failed"], results=results)

    @unary(("POST", "/v1/_channels/_await"))
    async def AwaitChannels(self, request: pb.AwaitChannelsRequest, principal: Principal) -> pb.AwaitChannelsResponse:
        out = await verbs.await_waiting(
            principal,
            channels=list(request.channels),
            scope=request.scope,
            scope_id=request.scope_id,
            from_cursor=request.from_cursor or None,
            mode=request.mode,
            n=request.n,
            max_messages=request.max_messages or None,
            wait_ms=request.wait_ms,
        )
        results = {
            name: pb.AwaitChannelEntry(messages=_messages(r["messages"]), next_cursor=r["next_cursor"] or "")
            for name, r in out["results"].items()
        }
        return pb.AwaitChannelsResponse(
            satisfied=out["satisfied"], timed_out=out["timed_out"], mode=out["mode"], fired=out["fired"],
            total_messages=out["total_messages"], results=results,
        )  # fmt: skip
