"""Streams and cursors: what one partition of a channel is, how a position in
it is written on the wire, and the doorbell its readers listen on.

Invariants:
- A stream is (tenant, channel, scope, scope_id); messages and the committed
  cursor live per stream.
- A cursor `cur_<16 hex ns>_<message id>` orders as its position
  ((visible_at, id)) does, so cursors compare as strings. `""` and `cur_0`
  are the position before every message.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apps.channels.errors import InvalidCursor

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
OLDEST_CURSORS = ("", "cur_0")
_CURSOR_RE = re.compile(r"cur_([0-9a-f]{16})_(msg_[0-9a-f]{24})")


@dataclass(frozen=True)
class Stream:
    """One partition of a channel: messages and the committed cursor live per stream."""

    tenant_id: str
    channel: str
    scope: str
    scope_id: str

    @property
    def key(self) -> str:
        return f"{self.channel}\x1f{self.scope}\x1f{self.scope_id}"

    @property
    def lock_key(self) -> str:
        return f"lc:chan:{self.tenant_id}\x1f{self.key}"

    def filter(self) -> dict[str, str]:
        return {"tenant_id": self.tenant_id, "channel": self.channel, "scope": self.scope, "scope_id": self.scope_id}


def bell(tenant_id: str, channel: str) -> str:
    """The Redis pub/sub channel rung after a publish to any stream of `channel`."""
    return f"lc:chan:{tenant_id}:{channel}"


def ns(moment: datetime) -> int:
    """Nanoseconds since the epoch (microsecond precision, as Postgres keeps it)."""
    return (moment - EPOCH) // timedelta(microseconds=1) * 1000


def encode_cursor(visible_at: datetime, msg_id: str) -> str:
    return f"cur_{ns(visible_at):016x}_{msg_id}"


@dataclass(frozen=True)
class Position:
    """Strictly after (visible_at, id); None as a position means from the oldest."""

    visible_at: datetime
    msg_id: str


def decode_cursor(raw: Any) -> Position | None:
    if raw is None or raw in OLDEST_CURSORS:
        return None
    if not isinstance(raw, str):
        raise InvalidCursor("cursor must be a string")
    match = _CURSOR_RE.fullmatch(raw)
    if match is None:
        raise InvalidCursor(f"invalid channel cursor {raw!r}: expected `cur_<16hex>_msg_<24hex>` or `cur_0`")
    nanos = int(match.group(1), 16)
    return Position(EPOCH + timedelta(microseconds=nanos // 1000), match.group(2))


def check_cursor(raw: Any) -> str | None:
    """A from_cursor as the reads take it (None: not given); 400 invalid_cursor."""
    decode_cursor(raw)
    return raw if isinstance(raw, str) else None


def new_message_id(published_at: datetime) -> str:
    return f"msg_{ns(published_at):016x}{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Read:
    """Messages read from one stream, oldest first."""

    stream: Stream
    messages: list[dict[str, Any]]  # {id, value, published_at}
    next_cursor: str  # "" when nothing was read
    cursors: tuple[str, ...] = ()  # each message's own cursor


@dataclass(frozen=True)
class Published:
    """One message a publish appended (or, for a repeated idempotency key, the first one)."""

    stream: Stream
    message_id: str
    published_at: datetime
    visible_at: datetime
    deferred: bool
    dropped_oldest: int
    payload_bytes: int
