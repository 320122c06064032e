"""Memory and channel tools: memory_get / memory_set / memory_search mirror
`/v1/_memory/...` (apps/memory/api.py), channel_publish / channel_subscribe
mirror `/v1/_channels/{name}/...` and, with `user_id`, the per-user routes
(apps/channels/api.py). Same selectors, services and presenters, the
caller's principal; which slot or stream a caller reaches is decided by
`memory.selectors.slot_for` and `channels.access`, as for REST.

A channel call without `user_id` reaches the tenant plane's global/tenant
stream, which REST keeps to substrate:tenant: the same check is made here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt

from apps.channels import access, presenters, verbs
from apps.channels.longpoll import subscribe_waiting
from apps.channels.streams import Stream
from apps.core.errors import Forbidden
from apps.core.http import db_call
from apps.core.types import Principal
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.memory import keyops
from apps.memory import selectors as memory_selectors
from apps.substrate.auth import CHANNEL_PUBLISH, CHANNEL_READ, TENANT, has_scope

MAX_TTL_SECONDS = 10 * 365 * 86400  # as the REST route's ttl_seconds bound


class MemorySlotArgs(Args):
    scope: str = Field(description="agent | user | tenant | global")
    scope_id: str = Field(default="", description="agent name or user id; ignored for tenant/global")


class MemoryGetArgs(MemorySlotArgs):
    key: str = Field(min_length=1, max_length=memory_selectors.MAX_KEY_CHARS)


class MemorySetArgs(MemoryGetArgs):
    value: Any = Field(description="any JSON value but null")
    ttl_seconds: StrictInt | None = Field(default=None, ge=1, le=MAX_TTL_SECONDS)
    embed: bool = False
    embed_text: str | None = None


class MemorySearchArgs(MemorySlotArgs):
    query: str = Field(min_length=1)
    top_k: int = Field(default=10, ge=1, le=50)
    rank: dict[str, Any] | None = None
    dedup: dict[str, Any] | None = None


def _memory_get(principal: Principal, args: MemoryGetArgs) -> dict[str, Any]:
    return keyops.key_get(principal, args.scope, args.scope_id, args.key)


def _memory_set(principal: Principal, args: MemorySetArgs) -> dict[str, Any]:
    body = keyops.MemoryPutIn(
        value=args.value, ttl_seconds=args.ttl_seconds, embed=args.embed, embed_text=args.embed_text
    )
    return keyops.key_put(principal, args.scope, args.scope_id, args.key, body)


def _memory_search(principal: Principal, args: MemorySearchArgs) -> dict[str, Any]:
    return keyops.search(principal, keyops.MemorySearchIn(**args.model_dump()))


async def memory_get(principal: Principal, args: MemoryGetArgs) -> dict[str, Any]:
    return await db_call(_memory_get)(principal, args)


async def memory_set(principal: Principal, args: MemorySetArgs) -> dict[str, Any]:
    return await db_call(_memory_set)(principal, args)


async def memory_search(principal: Principal, args: MemorySearchArgs) -> dict[str, Any]:
    return await db_call(_memory_search)(principal, args)


# --- channels ---------------------------------------------------------------------------


class ChannelArgs(Args):
    channel: str = Field(min_length=1, description="channel name")
    user_id: str | None = Field(default=None, description="the user's stream of a scope=user channel")


class ChannelPublishArgs(ChannelArgs):
    payload: Any = Field(description="any JSON value but null")
    deliver_at: str | None = Field(default=None, description="RFC 3339; absent or past: visible now")
    ttl: StrictInt | None = Field(default=None, ge=0, description="seconds; 0 or absent: the channel's default")


class ChannelSubscribeArgs(ChannelArgs):
    from_cursor: str | None = Field(default=None, description='absent: the committed cursor; "cur_0": the oldest')
    max_messages: StrictInt | None = Field(default=None, description="default 10, at most 100")
    wait_ms: StrictInt | None = Field(default=None, ge=0, description="long-poll; cut to the server's cap")


def channel_target(principal: Principal, args: ChannelArgs) -> access.Target:
    if args.user_id is not None:
        return access.user_stream(principal, args.user_id, args.channel)
    if not has_scope(principal.scopes, TENANT):  # as REST's /v1/_channels/{name}/... route
        raise Forbidden(f"channel {args.channel!r} without user_id needs scope {TENANT!r}", code="insufficient_scope")
    return access.admin_stream(principal, args.channel)


def _publish(principal: Principal, args: ChannelPublishArgs) -> dict[str, Any]:
    target = channel_target(principal, args)
    by_user = access.user_publisher(principal) if args.user_id is not None else access.ADMIN
    return verbs.publish(target, value=args.payload, ttl=args.ttl, deliver_at=args.deliver_at, by_user=by_user)


async def channel_publish(principal: Principal, args: ChannelPublishArgs) -> dict[str, Any]:
    return await db_call(_publish)(principal, args)


async def channel_subscribe(principal: Principal, args: ChannelSubscribeArgs) -> dict[str, Any]:
    """Reads after the committed cursor and commits it; `wait_ms` long-polls as REST does."""
    stream: Stream = (await db_call(channel_target)(principal, args))[0]
    read = await subscribe_waiting(
        stream=stream, from_cursor=args.from_cursor, max_messages=args.max_messages, wait_ms=args.wait_ms
    )
    return presenters.read_result(read)


register(
    McpTool(
        "memory_get",
        "Read one live memory key of a (scope, scope_id) in your tenant.",
        TENANT,
        MemoryGetArgs,
        memory_get,
    ),
    McpTool(
        "memory_set",
        "Write one memory key {scope, scope_id, key, value, ttl_seconds?, embed?}.",
        TENANT,
        MemorySetArgs,
        memory_set,
    ),
    McpTool(
        "memory_search",
        "Semantic search of one (scope, scope_id): the top_k entries for a query.",
        TENANT,
        MemorySearchArgs,
        memory_search,
    ),
    McpTool(
        "channel_publish",
        "Publish a payload to a channel (a scope=user channel's stream with user_id).",
        CHANNEL_PUBLISH,
        ChannelPublishArgs,
        channel_publish,
    ),
    McpTool(
        "channel_subscribe",
        "Read a channel's messages after the committed cursor and commit it; wait_ms long-polls.",
        CHANNEL_READ,
        ChannelSubscribeArgs,
        channel_subscribe,
    ),
)
