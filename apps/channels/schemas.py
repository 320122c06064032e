"""Request bodies of the channels REST plane (SPEC 2.7). Unknown fields are a
400 (`invalid_body`); numbers are strict (no "5", no true). Fields whose
errors carry their own code (payload, deliver_at, from_cursor, mode, n) stay
`Any` here and are checked by the channel services, selectors and access rules."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

Count = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]  # fits a PositiveIntegerField


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelCreateIn(_In):
    name: StrictStr
    description: StrictStr = ""
    scope: Literal["global", "agent", "user", "tenant"] = "global"
    semantic: Literal["queue", "broadcast", "topic"] = "queue"
    default_ttl: Count | None = None  # seconds; 0 or absent: messages never expire
    max_messages: Count | None = None  # 0 or absent: no cap
    publisher: StrictStr = ""  # "system": agents may not publish
    period: StrictStr = ""


class ChannelUpdateIn(_In):
    description: StrictStr | None = None
    semantic: Literal["queue", "broadcast", "topic"] | None = None
    default_ttl: Count | None = None
    max_messages: Count | None = None


class ChannelPublishIn(_In):
    payload: Any = None  # required; any JSON value but null
    deliver_at: Any = None  # RFC 3339; past or absent: visible now
    ttl: Count | None = None  # seconds; 0 or absent: the channel's default_ttl


class ChannelSubscribeIn(_In):
    from_cursor: Any = None  # absent: the committed cursor; "cur_0": from the oldest
    max_messages: StrictInt | None = None  # default 10, cap 100
    wait_ms: Count | None = None  # long-poll; cut to LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS


class ChannelAckIn(_In):
    cursor: Any = None


class _Fanout(_In):
    channels: Any = None  # 1..32 names, checked by access.fanout_names
    scope: Literal["", "global", "tenant", "user", "agent"] = ""  # "": each channel's declared scope
    scope_id: StrictStr = ""  # the user id (user) or agent name (agent)


class ChannelAwaitIn(_Fanout):
    mode: Any = None  # any (default) | all | at_least
    n: Any = None  # at_least: messages needed in total
    from_cursor: Any = None  # applied to every channel; absent: each stream's committed cursor
    max_messages: StrictInt | None = None
    wait_ms: Count | None = None


class ChannelBroadcastIn(_Fanout):
    payload: Any = None
    deliver_at: Any = None
    ttl: Count | None = None
