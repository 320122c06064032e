"""loomcycle's channel meta-tools beyond publish/subscribe, with its names and shapes:
`channeldef` (create / update / delete / purge a declaration: `/v1/_channels` POST,
`/v1/_channels/{name}` PATCH / DELETE, `.../purge`), `list_channels` (`GET /v1/_channels`),
`peek_channel` and `ack_channel` (`.../peek`, `.../ack`, and the per-user routes), and
`publish_channel` / `subscribe_channel` (loomcycle's `{scope, scope_id}` form of
`channel_publish` / `channel_subscribe`). Each calls what its REST route calls
(apps.channels.verbs, services, cursors, selectors) with the caller's principal; which
stream a call reaches is `channel_target`'s (tools_data), as for the other channel tools.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt, ValidationError

from apps.channels import cursors, presenters, selectors, services, verbs
from apps.channels.schemas import ChannelCreateIn, ChannelUpdateIn
from apps.channels.streams import check_cursor
from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.types import Principal
from apps.mcp.server.tools_data import (
    ChannelArgs,
    ChannelPublishArgs,
    ChannelSubscribeArgs,
    channel_publish,
    channel_subscribe,
    channel_target,
)
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.substrate.auth import CHANNEL_PUBLISH, CHANNEL_READ, TENANT


class ChannelDefArgs(Args):
    op: Literal["create", "update", "delete", "purge"]
    name: str = Field(min_length=1, description="the channel's name")
    description: str | None = None
    scope: str | None = Field(default=None, description="create only: global (default), tenant, agent or user")
    semantic: str | None = Field(default=None, description="queue (default), broadcast or topic")
    default_ttl: StrictInt | None = Field(default=None, description="seconds; 0: no expiry")
    max_messages: StrictInt | None = Field(default=None, description="0: no cap")
    publisher: str | None = Field(default=None, description="create only")


class ScopedArgs(Args):
    """loomcycle's stream address: `scope` global (the tenant plane) or user (with `scope_id`)."""

    channel: str = Field(min_length=1)
    scope: Literal["global", "user"]
    scope_id: str | None = Field(default=None, description="the user id; required when scope=user")

    def plain(self) -> ChannelArgs:
        if self.scope == "user" and not self.scope_id:
            raise Invalid("scope_id is required when scope=user (the user id)", code="invalid_body")
        return ChannelArgs(channel=self.channel, user_id=self.scope_id if self.scope == "user" else None)


class PeekArgs(ScopedArgs):
    from_cursor: str | None = Field(default=None, description='absent: from the oldest ("cur_0")')
    max_messages: StrictInt | None = Field(default=None, description="default 10, at most 100")


class AckArgs(ScopedArgs):
    cursor: str = Field(description="the cursor to commit (a message's next_cursor)")


class PublishArgs(ScopedArgs):
    payload: Any = Field(description="any JSON value but null")
    deliver_at: str | None = None
    ttl: StrictInt | None = Field(default=None, ge=0)


class SubscribeArgs(ScopedArgs):
    from_cursor: str | None = None
    max_messages: StrictInt | None = None
    wait_ms: StrictInt | None = Field(default=None, ge=0)


_CREATE_FIELDS = ("name", "description", "scope", "semantic", "default_ttl", "max_messages", "publisher")
_UPDATE_FIELDS = ("description", "semantic", "default_ttl", "max_messages")


def _checked(schema: type[Any], data: dict[str, Any]) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise Invalid(f"{where}: {exc.errors()[0]['msg']}", code="invalid_body") from exc


def _channeldef(principal: Principal, args: ChannelDefArgs) -> dict[str, Any]:
    given = args.model_dump(exclude_none=True)
    if args.op == "create":
        body = _checked(ChannelCreateIn, {k: v for k, v in given.items() if k in _CREATE_FIELDS})
        return verbs.channel_create(principal, body)
    if args.op == "update":
        body = _checked(ChannelUpdateIn, {k: v for k, v in given.items() if k in _UPDATE_FIELDS})
        return verbs.channel_update(principal, args.name, body.model_dump())
    if args.op == "delete":
        services.channel_delete(tenant_id=principal.tenant_id, name=args.name)
        return {"deleted": args.name}
    return services.channel_purge(tenant_id=principal.tenant_id, name=args.name)


async def channeldef(principal: Principal, args: ChannelDefArgs) -> dict[str, Any]:
    return await db_call(_channeldef)(principal, args)


class NoArgs(Args):
    """No arguments."""


async def list_channels(principal: Principal, args: NoArgs) -> dict[str, Any]:
    return {"channels": await db_call(verbs.channel_list)(principal)}


def _peek(principal: Principal, args: PeekArgs) -> dict[str, Any]:
    stream = channel_target(principal, args.plain())[0]
    max_messages = selectors.clamp_max(args.max_messages)
    read = selectors.peek(stream=stream, from_cursor=check_cursor(args.from_cursor), max_messages=max_messages)
    return presenters.peek_result(read)


async def peek_channel(principal: Principal, args: PeekArgs) -> dict[str, Any]:
    return await db_call(_peek)(principal, args)


def _ack(principal: Principal, args: AckArgs) -> dict[str, Any]:
    return cursors.ack(stream=channel_target(principal, args.plain())[0], cursor=args.cursor)


async def ack_channel(principal: Principal, args: AckArgs) -> dict[str, Any]:
    return await db_call(_ack)(principal, args)


async def publish_channel(principal: Principal, args: PublishArgs) -> dict[str, Any]:
    plain = args.plain()
    publish = ChannelPublishArgs(
        channel=plain.channel, user_id=plain.user_id, payload=args.payload, deliver_at=args.deliver_at, ttl=args.ttl
    )
    return await channel_publish(principal, publish)


async def subscribe_channel(principal: Principal, args: SubscribeArgs) -> dict[str, Any]:
    plain = args.plain()
    subscribe = ChannelSubscribeArgs(
        channel=plain.channel,
        user_id=plain.user_id,
        from_cursor=args.from_cursor,
        max_messages=args.max_messages,
        wait_ms=args.wait_ms,
    )
    return await channel_subscribe(principal, subscribe)


register(
    McpTool(
        "channeldef",
        "Channel declarations in your tenant: op create | update | delete | purge (purge empties any channel, "
        "yaml ones too; the others refuse yaml channels with channel_yaml_immutable).",
        TENANT,
        ChannelDefArgs,
        channeldef,
    ),
    McpTool(
        "list_channels", "The channels your tenant sees, with their message counts.", TENANT, NoArgs, list_channels
    ),
    McpTool(
        "peek_channel",
        "Read a channel's messages without committing the cursor (scope global, or user with scope_id).",
        CHANNEL_READ,
        PeekArgs,
        peek_channel,
    ),
    McpTool(
        "ack_channel",
        "Commit a channel cursor (409 channel_cursor_regression when older than the committed one).",
        CHANNEL_READ,
        AckArgs,
        ack_channel,
    ),
    McpTool(
        "publish_channel",
        "loomcycle's form of channel_publish: {channel, scope, scope_id?, payload}.",
        CHANNEL_PUBLISH,
        PublishArgs,
        publish_channel,
    ),
    McpTool(
        "subscribe_channel",
        "loomcycle's form of channel_subscribe: {channel, scope, scope_id?, from_cursor?, max_messages?, wait_ms?}.",
        CHANNEL_READ,
        SubscribeArgs,
        subscribe_channel,
    ),
)
