"""`client.channels`: channels of the caller's tenant (/v1/_channels; docs/api.md, "Channels").

`publish`, `subscribe`, `ack` and `peek` take `user_id=` for a `scope: user` channel: they then
use the per-user routes (/v1/users/{user_id}/channels/{name}/...) and that user's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

from loomcycle_http.client import _base as b
from loomcycle_http.client.types import Channel, ChannelList, ChannelPublished, ChannelRead, Messages

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Names = list[str]  # (an alias: `list` is also a method name below)
LIST = b.Call("GET", "/v1/_channels")


def path(name: str, verb: str = "", user_id: str | None = None) -> str:
    """The admin route of `name`, or the per-user one with `user_id`."""
    if user_id is None:
        return b.channel_path(name, verb)
    return f"/v1/users/{b.seg(user_id)}/channels/{b.seg(name, slashes=True)}/{verb}"


def message(payload: Any, ttl: int | None, deliver_at: str | None) -> Row:
    return {"payload": payload, **({"ttl": ttl} if ttl else {}), **({"deliver_at": deliver_at} if deliver_at else {})}


def publish_call(name: str, payload: Any, ttl: int | None, deliver_at: str | None, user_id: str | None) -> b.Call:
    return b.Call("POST", path(name, "publish", user_id), json=message(payload, ttl, deliver_at))


def peek_call(name: str, from_cursor: str, max_messages: int, user_id: str | None) -> b.Call:
    return b.Call("GET", path(name, "peek", user_id), params={"from_cursor": from_cursor, "max_messages": max_messages})


def await_call(channels: Names, fields: dict[str, Any]) -> b.Call:
    """POST /v1/_channels/_await: `mode`, `n`, `from_cursor`, `max_messages`, `wait_ms`, `scope`, `scope_id`."""
    return b.Call("POST", "/v1/_channels/_await", json={"channels": channels, **fields})


def broadcast_call(channels: Names, payload: Any, fields: dict[str, Any]) -> b.Call:
    return b.Call("POST", "/v1/_channels/_broadcast", json={"channels": channels, "payload": payload, **fields})


def wait_timeout(fields: dict[str, Any]) -> float:
    return float(fields.get("wait_ms") or 0) / 1000 + 30


class Channels:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("channels_list")
    def list(self) -> ChannelList:
        return list(self._c.send(LIST)["channels"])

    @b.op("channel_create")
    def create(self, name: str, **fields: Any) -> Channel:
        """Declare a runtime channel (`description`, `scope`, `semantic`, `default_ttl`, `max_messages`, ...)."""
        return cast(Channel, self._c.send(b.Call("POST", "/v1/_channels", json={"name": name, **fields})))

    @b.op("channel_update")
    def update(self, name: str, **fields: Any) -> Channel:
        """Change a runtime channel's `description`, `semantic`, `default_ttl`, `max_messages` (0 = none)."""
        return cast(Channel, self._c.send(b.Call("PATCH", path(name), json=fields)))

    @b.op("channel_delete")
    def delete(self, name: str) -> None:
        """Delete a runtime channel and its messages (409 for a yaml-declared one)."""
        self._c.send(b.Call("DELETE", path(name)))

    @b.op("channel_purge")
    def purge(self, name: str) -> Row:
        """Delete every message of the channel in the caller's tenant: `{name, purged}`."""
        return dict(self._c.send(b.Call("POST", path(name, "purge"))))

    @b.op("channel_subscribe", "user_channel_subscribe")
    def subscribe(self, name: str, *, user_id: str | None = None, **fields: Any) -> ChannelRead:
        """Read after the committed cursor (or `from_cursor`) and commit it; `max_messages`, `wait_ms`."""
        call = b.Call("POST", path(name, "subscribe", user_id), json=fields)
        return cast(ChannelRead, self._c.send(call, timeout=wait_timeout(fields)))

    @b.op("channel_ack", "user_channel_ack")
    def ack(self, name: str, cursor: str, *, user_id: str | None = None) -> None:
        """Commit `cursor`; 409 channel_cursor_regression when it is older than the committed one."""
        self._c.send(b.Call("POST", path(name, "ack", user_id), json={"cursor": cursor}))

    @b.op("channel_publish", "user_channel_publish")
    def publish(
        self,
        name: str,
        payload: Any,
        *,
        ttl: int | None = None,
        deliver_at: str | None = None,
        user_id: str | None = None,
    ) -> ChannelPublished:
        return cast(ChannelPublished, self._c.send(publish_call(name, payload, ttl, deliver_at, user_id)))

    @b.op("channel_system_publish")
    def system_publish(self, name: str, payload: Any, *, ttl: int | None = None, deliver_at: str | None = None) -> Row:
        """Publish on a yaml-declared `_system/...` channel (POST /v1/_channels/{name})."""
        return dict(self._c.send(b.Call("POST", path(name), json=message(payload, ttl, deliver_at))))

    @b.op("channels_broadcast")
    def broadcast(self, channels: Names, payload: Any, **fields: Any) -> Row:
        """Publish `payload` on every channel (`deliver_at`, `ttl`, `scope`, `scope_id`): `{published, results}`."""
        return dict(self._c.send(broadcast_call(channels, payload, fields)))

    @b.op("channel_peek", "user_channel_peek")
    def peek(
        self, name: str, *, from_cursor: str = "cur_0", max_messages: int = 100, user_id: str | None = None
    ) -> Messages:
        """Messages after `from_cursor`, without committing a cursor."""
        return list(self._c.send(peek_call(name, from_cursor, max_messages, user_id))["messages"])

    @b.op("channels_await")
    def await_any(self, channels: Names, **fields: Any) -> Row:
        """Long-poll several channels (POST /v1/_channels/_await, never commits): `{satisfied, results, ...}`."""
        return dict(self._c.send(await_call(channels, fields), timeout=wait_timeout(fields)))

    def wait(self, name: str, *, from_cursor: str = "cur_0", max_messages: int = 100, wait_ms: int = 25_000) -> Any:
        """Long-poll one channel for messages after `from_cursor` (never commits):
        `{"messages", "next_cursor"}`, empty when the wait ran out."""
        fields = {"mode": "any", "from_cursor": from_cursor, "max_messages": max_messages, "wait_ms": wait_ms}
        answer = self.await_any([name], **fields)
        return answer["results"].get(name) or {"messages": [], "next_cursor": from_cursor}

    def tail(self, name: str, *, from_cursor: str = "cur_0", wait_ms: int = 25_000) -> Iterator[Row]:
        """Every message after `from_cursor`, then each new one as it is published (forever)."""
        while True:
            page = self.wait(name, from_cursor=from_cursor, wait_ms=wait_ms)
            yield from page["messages"]
            from_cursor = page.get("next_cursor") or from_cursor


class AsyncChannels:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("channels_list")
    async def list(self) -> ChannelList:
        return list((await self._c.send(LIST))["channels"])

    @b.op("channel_create")
    async def create(self, name: str, **fields: Any) -> Channel:
        return cast(Channel, await self._c.send(b.Call("POST", "/v1/_channels", json={"name": name, **fields})))

    @b.op("channel_update")
    async def update(self, name: str, **fields: Any) -> Channel:
        return cast(Channel, await self._c.send(b.Call("PATCH", path(name), json=fields)))

    @b.op("channel_delete")
    async def delete(self, name: str) -> None:
        await self._c.send(b.Call("DELETE", path(name)))

    @b.op("channel_purge")
    async def purge(self, name: str) -> Row:
        return dict(await self._c.send(b.Call("POST", path(name, "purge"))))

    @b.op("channel_subscribe", "user_channel_subscribe")
    async def subscribe(self, name: str, *, user_id: str | None = None, **fields: Any) -> ChannelRead:
        call = b.Call("POST", path(name, "subscribe", user_id), json=fields)
        return cast(ChannelRead, await self._c.send(call, timeout=wait_timeout(fields)))

    @b.op("channel_ack", "user_channel_ack")
    async def ack(self, name: str, cursor: str, *, user_id: str | None = None) -> None:
        await self._c.send(b.Call("POST", path(name, "ack", user_id), json={"cursor": cursor}))

    @b.op("channel_publish", "user_channel_publish")
    async def publish(
        self,
        name: str,
        payload: Any,
        *,
        ttl: int | None = None,
        deliver_at: str | None = None,
        user_id: str | None = None,
    ) -> ChannelPublished:
        return cast(ChannelPublished, await self._c.send(publish_call(name, payload, ttl, deliver_at, user_id)))

    @b.op("channel_system_publish")
    async def system_publish(
        self, name: str, payload: Any, *, ttl: int | None = None, deliver_at: str | None = None
    ) -> Row:
        return dict(await self._c.send(b.Call("POST", path(name), json=message(payload, ttl, deliver_at))))

    @b.op("channels_broadcast")
    async def broadcast(self, channels: Names, payload: Any, **fields: Any) -> Row:
        return dict(await self._c.send(broadcast_call(channels, payload, fields)))

    @b.op("channel_peek", "user_channel_peek")
    async def peek(
        self, name: str, *, from_cursor: str = "cur_0", max_messages: int = 100, user_id: str | None = None
    ) -> Messages:
        return list((await self._c.send(peek_call(name, from_cursor, max_messages, user_id)))["messages"])

    @b.op("channels_await")
    async def await_any(self, channels: Names, **fields: Any) -> Row:
        return dict(await self._c.send(await_call(channels, fields), timeout=wait_timeout(fields)))

    async def wait(
        self, name: str, *, from_cursor: str = "cur_0", max_messages: int = 100, wait_ms: int = 25_000
    ) -> Any:
        fields = {"mode": "any", "from_cursor": from_cursor, "max_messages": max_messages, "wait_ms": wait_ms}
        answer = await self.await_any([name], **fields)
        return answer["results"].get(name) or {"messages": [], "next_cursor": from_cursor}

    async def tail(self, name: str, *, from_cursor: str = "cur_0", wait_ms: int = 25_000) -> AsyncIterator[Row]:
        while True:
            page = await self.wait(name, from_cursor=from_cursor, wait_ms=wait_ms)
            for item in page["messages"]:
                yield item
            from_cursor = page.get("next_cursor") or from_cursor
