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


# What kinds.fields.check_channel_name accepts (it also refuses `.`/`..` segments).
CHANNEL_NAME_DOC: dict[str, Any] = {
    "minLength": 1,
    "maxLength": 256,
    "pattern": r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
}


class ChannelCreateIn(_In):
    name: StrictStr = Field(json_schema_extra=CHANNEL_NAME_DOC)
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


# Documented as the services check them: a payload is required and not null,
# deliver_at is an RFC 3339 time (absent or null: now).
PAYLOAD_DOC: dict[str, Any] = {"not": {"type": "null"}}
DELIVER_AT_DOC: dict[str, Any] = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}


class ChannelPublishIn(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["payload"]})

    payload: Any = Field(default=None, json_schema_extra=PAYLOAD_DOC)  # required; any JSON value but null
    deliver_at: Any = Field(default=None, json_schema_extra=DELIVER_AT_DOC)  # past or absent: visible now
    ttl: Count | None = None  # seconds; 0 or absent: the channel's default_ttl


class ChannelSubscribeIn(_In):
    from_cursor: Any = None  # absent: the committed cursor; "cur_0": from the oldest
    max_messages: StrictInt | None = None  # default 10, cap 100
    wait_ms: Count | None = None  # long-poll; cut to LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS


CURSOR_PATTERN = r"^(cur_0|cur_[0-9a-f]{16}_msg_[0-9a-f]{24})$"  # what streams.decode_cursor accepts


class ChannelAckIn(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["cursor"]})

    cursor: Any = Field(default=None, json_schema_extra={"type": "string", "pattern": CURSOR_PATTERN})


class _Fanout(_In):
    # 1..32 names, checked by access.fanout_names (400 missing_channels when absent).
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["channels"]})

    channels: Any = Field(
        default=None,
        json_schema_extra={"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 32},
    )
    scope: Literal["", "global", "tenant", "user", "agent"] = ""  # "": each channel's declared scope
    scope_id: StrictStr = ""  # the user id (user) or agent name (agent)


class ChannelAwaitIn(_Fanout):
    mode: Any = None  # any (default) | all | at_least
    n: Any = None  # at_least: messages needed in total
    from_cursor: Any = None  # applied to every channel; absent: each stream's committed cursor
    max_messages: StrictInt | None = None
    wait_ms: Count | None = None


class ChannelBroadcastIn(_Fanout):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["channels", "payload"]})

    payload: Any = Field(default=None, json_schema_extra=PAYLOAD_DOC)
    deliver_at: Any = Field(default=None, json_schema_extra=DELIVER_AT_DOC)
    ttl: Count | None = None


# --- response schemas (/v1/openapi.json): what apps.channels.presenters build --------


class ChannelOut(BaseModel):
    """A channel as its tenant sees it (presenters.descriptor)."""

    name: str
    description: str
    scope: str
    semantic: str
    publisher: str
    period: str
    default_ttl: int
    max_messages: int
    source: str
    message_count: int
    newest_visible_at: str | None
    created_at: str | None
    updated_at: str | None


class ChannelsOut(BaseModel):
    channels: list[ChannelOut]


class ChannelMessageOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    value: Any
    published_at: str


class ChannelReadOut(BaseModel):
    channel: str
    messages: list[ChannelMessageOut]
    next_cursor: str


class ChannelPeekOut(BaseModel):
    channel: str
    messages: list[ChannelMessageOut]


class ChannelPublishedOut(BaseModel):
    msg_id: str
    channel: str
    created_at: str
    dropped_oldest: int
    visible_at: str | None = None  # present when deliver_at deferred the message


class ChannelBroadcastResultOut(BaseModel):
    """A published channel's ChannelPublishedOut fields, or `error` and `code` for a refused one."""

    model_config = ConfigDict(extra="allow")

    channel: str
    error: str | None = None
    code: str | None = None


class ChannelBroadcastOut(BaseModel):
    published: int
    failed: int
    results: list[ChannelBroadcastResultOut]


class ChannelAwaitReadOut(BaseModel):
    messages: list[ChannelMessageOut]
    next_cursor: str


class ChannelAwaitOut(BaseModel):
    satisfied: bool
    timed_out: bool
    mode: str
    fired: list[str]
    total_messages: int
    results: dict[str, ChannelAwaitReadOut]


class ChannelAckOut(BaseModel):
    ok: bool


class ChannelPurgedOut(BaseModel):
    name: str
    purged: int
