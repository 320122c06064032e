"""Channel reads: declarations, message stats, stream reads that commit
nothing, and the fan-in (await) read.

Invariants:
- Every read names its tenant (a `tenant_id` keyword or a `Stream`).
- Reads filter `visible_at <= now()` and unexpired rows, in (visible_at, id)
  order, strictly after a cursor.
- Nothing here writes: the cursor-committing read (`subscribe`) is a service.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Max
from django.db.models.functions import Now

from apps.channels.errors import ChannelNotDeclared
from apps.channels.models import ChannelCursor, ChannelMessage
from apps.channels.streams import EPOCH, Position, Read, Stream, decode_cursor, encode_cursor
from apps.core.errors import Invalid
from apps.core.timefmt import ts
from apps.substrate.models import ChannelDef, DefSource

MAX_MESSAGES_DEFAULT, MAX_MESSAGES_CAP = 10, 100
MODES = ("any", "all", "at_least")

# --- declarations -----------------------------------------------------------------


def channel_get(*, tenant_id: str, name: str) -> ChannelDef:
    """The declaration a tenant sees under `name`: yaml first (immutable,
    shared), then the tenant's runtime channel, then a shared runtime one."""
    rows = {(c.tenant_id, c.source): c for c in ChannelDef.objects.filter(name=name, tenant_id__in={tenant_id, ""})}
    for key in (("", DefSource.YAML), (tenant_id, DefSource.RUNTIME), ("", DefSource.RUNTIME)):
        if key in rows:
            return rows[key]
    raise ChannelNotDeclared(f'channel "{name}" is not declared (yaml `channels:` or POST /v1/_channels)')


def channels_visible(*, tenant_id: str) -> list[ChannelDef]:
    rows = ChannelDef.objects.filter(tenant_id__in={tenant_id, ""}).order_by("name")
    seen: dict[str, ChannelDef] = {}
    for row in rows:
        current = seen.get(row.name)
        if current is None or row.source == DefSource.YAML or (row.tenant_id and current.source != DefSource.YAML):
            seen[row.name] = row
    return list(seen.values())


@dataclass(frozen=True)
class ChannelStats:
    message_count: int
    newest_visible_at: datetime | None


def channel_stats(*, tenant_id: str, name: str) -> ChannelStats:
    """Message stats of the tenant's own streams of channel `name`."""
    stats = ChannelMessage.objects.filter(tenant_id=tenant_id, channel=name).aggregate(
        n=Count("id"), newest=Max("visible_at")
    )
    return ChannelStats(stats["n"], stats["newest"])


# --- stream reads -----------------------------------------------------------------

_READ_SQL = """
SELECT id, payload, published_at, visible_at FROM agent_channels_channelmessage
WHERE tenant_id = %s AND channel = %s AND scope = %s AND scope_id = %s
  AND visible_at <= now() AND (expires_at IS NULL OR expires_at > now())
  AND (visible_at, id) > (%s, %s)
ORDER BY visible_at, id
LIMIT %s
"""
_BEFORE_ALL = Position(EPOCH, "")


def stream_read(stream: Stream, after: Position | None, limit: int) -> Read:
    """Up to `limit` visible messages strictly after `after` (None: from the oldest)."""
    after = after or _BEFORE_ALL
    with connection.cursor() as cur:
        cur.execute(
            _READ_SQL,
            [stream.tenant_id, stream.channel, stream.scope, stream.scope_id, after.visible_at, after.msg_id, limit],
        )
        rows = cur.fetchall()
    messages = [{"id": r[0], "value": _json(r[1]), "published_at": ts(r[2])} for r in rows]
    cursors = tuple(encode_cursor(r[3], r[0]) for r in rows)
    return Read(stream, messages, cursors[-1] if cursors else "", cursors)


def _json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def committed_cursor(stream: Stream) -> str:
    """The stream's committed cursor ("" = from the oldest), without locking it."""
    return ChannelCursor.objects.filter(**stream.filter()).values_list("cursor", flat=True).first() or ""


def newest_cursor(stream: Stream) -> str:
    """The cursor of the stream's newest visible message ("" when it has none)."""
    row = (
        ChannelMessage.objects.filter(visible_at__lte=Now(), **stream.filter())
        .order_by("-visible_at", "-id")
        .values_list("visible_at", "id")
        .first()
    )
    return encode_cursor(row[0], row[1]) if row else ""


def clamp_max(value: Any) -> int:
    """A max_messages as the reads take it: default 10, at most 100."""
    if value is None:
        return MAX_MESSAGES_DEFAULT
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid("max_messages must be an integer", code="invalid_max_messages")
    return MAX_MESSAGES_DEFAULT if value <= 0 else min(value, MAX_MESSAGES_CAP)


def peek(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Non-committing; without `from_cursor` it reads from the oldest."""
    return stream_read(stream, decode_cursor(from_cursor), max_messages)


def pending(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Non-committing read after `from_cursor` or else the committed cursor (await)."""
    start = from_cursor if from_cursor is not None else committed_cursor(stream)
    return stream_read(stream, decode_cursor(start), max_messages)


# --- fan-in -----------------------------------------------------------------------


@dataclass(frozen=True)
class AwaitSpec:
    mode: str
    n: int
    max_messages: int


def check_await(mode: Any, n: Any, prefix: str = "await: ") -> AwaitSpec:
    mode = mode or "any"
    if mode not in MODES:
        raise Invalid(f'{prefix}unknown mode "{mode}" (must be one of: any, all, at_least)', code="invalid_mode")
    if mode == "at_least" and (not isinstance(n, int) or isinstance(n, bool) or n <= 0):
        raise Invalid(f"{prefix}mode=at_least requires n > 0", code="invalid_n")
    return AwaitSpec(mode, n if mode == "at_least" else 0, MAX_MESSAGES_DEFAULT)


@dataclass(frozen=True)
class Awaited:
    """One fan-in read: what each stream holds and whether the await is satisfied."""

    spec: AwaitSpec
    reads: list[Read]
    satisfied: bool
    timed_out: bool

    @property
    def fired(self) -> list[str]:
        return [r.stream.channel for r in self.reads if r.messages]

    @property
    def total_messages(self) -> int:
        return sum(len(r.messages) for r in self.reads)


def await_read(*, streams: Iterable[tuple[Stream, str | None]], spec: AwaitSpec, timed_out: bool) -> Awaited:
    """One non-committing read of every stream (from its cursor, else the committed one)."""
    reads = [pending(stream=s, from_cursor=c, max_messages=spec.max_messages) for s, c in streams]
    total = sum(len(r.messages) for r in reads)
    fired = sum(1 for r in reads if r.messages)
    if spec.mode == "any":
        satisfied = fired > 0
    elif spec.mode == "all":
        satisfied = fired == len(reads)
    else:
        satisfied = total >= spec.n
    return Awaited(spec, reads, satisfied, timed_out and not satisfied)
