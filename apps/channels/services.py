"""Channel verbs (SPEC 6.3, 9.4): publish, subscribe, peek, ack, await, purge,
and runtime channel CRUD.

Invariants:
- Publishes to one stream are serialised by a transaction-scoped advisory
  lock taken BEFORE the publish time is read (from Postgres' clock), so the
  order of (visible_at, id) is the order of commits. A reader that has seen a
  message has therefore seen every message ordered before it, and a cursor
  never skips a message that commits late. A `deliver_at` in the future is
  the message's visible_at; one already past counts as immediate.
- Reads filter `visible_at <= now()` and unexpired rows, in (visible_at, id)
  order, strictly after a cursor.
- `subscribe` commits the cursor in the transaction that reads (at most once
  per stream: readers of one stream are serialised on the cursor row); the
  cursor only moves forward. `ack` refuses a regression (409).
- Overflow beyond the channel's `max_messages` is trimmed, oldest first, in
  the publishing transaction.
- After a publish commits: stream readers are rung (Redis pub/sub, at most
  once: readers re-read Postgres) and parked runs waiting on the stream are
  answered (apps.channels.waits).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max
from django.utils import timezone

from apps.channels.models import ChannelCursor, ChannelMessage, ChannelWait
from apps.core.errors import ApplicationError, Conflict, Forbidden, Invalid, NotFound, PayloadTooLarge
from apps.core.redis import sync_client
from apps.core.timefmt import ts
from apps.substrate.models import ChannelDef, DefSource

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_MESSAGES_DEFAULT, MAX_MESSAGES_CAP = 10, 100
MAX_FANOUT = 32  # channels per await / broadcast
SWEEP_BATCH = 1000
_CURSOR_RE = re.compile(r"cur_([0-9a-f]{16})_(msg_[0-9a-f]{24})")
OLDEST_CURSORS = ("", "cur_0")


class ChannelNotDeclared(NotFound):
    code = "channel_not_declared"


class ChannelNotFound(NotFound):
    code = "channel_not_found"


class ChannelCursorRegression(Conflict):
    code = "channel_cursor_regression"


class ChannelValueTooLarge(PayloadTooLarge):
    code = "channel_value_too_large"


class ChannelYamlImmutable(Conflict):
    code = "channel_yaml_immutable"


class ChannelNameInUse(Conflict):
    code = "channel_name_in_use"


class NonSystemChannel(Forbidden):
    code = "non_system_channel"


class ChannelScopeInvalid(Invalid):
    code = "channel_scope_invalid"


class InvalidCursor(Invalid):
    code = "invalid_cursor"


# --- streams, positions, cursors --------------------------------------------------


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


def _ns(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1) * 1000


def encode_cursor(visible_at: datetime, msg_id: str) -> str:
    return f"cur_{_ns(visible_at):016x}_{msg_id}"


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
    ns = int(match.group(1), 16)
    return Position(EPOCH + timedelta(microseconds=ns // 1000), match.group(2))


def _new_message_id(published_at: datetime) -> str:
    return f"msg_{_ns(published_at):016x}{secrets.token_hex(4)}"


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


def descriptor(row: ChannelDef, *, tenant_id: str) -> dict[str, Any]:
    """The channel as `tenant_id` sees it: message stats are of its own streams."""
    stats = ChannelMessage.objects.filter(tenant_id=tenant_id, channel=row.name).aggregate(
        n=Count("id"), newest=Max("visible_at")
    )
    return {
        "name": row.name,
        "description": row.description,
        "scope": row.scope,
        "semantic": row.semantic,
        "publisher": row.publisher,
        "period": row.period,
        "default_ttl": row.default_ttl_seconds or 0,
        "max_messages": row.max_messages or 0,
        "source": row.source,
        "message_count": stats["n"],
        "newest_visible_at": ts(stats["newest"]),
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
    }


@dataclass(frozen=True)
class ChannelSpec:
    description: str = ""
    scope: str = "global"
    semantic: str = "queue"
    default_ttl: int | None = None
    max_messages: int | None = None
    publisher: str = ""
    period: str = ""


def channel_create(*, tenant_id: str, name: str, spec: ChannelSpec) -> ChannelDef:
    with transaction.atomic():
        existing = ChannelDef.objects.select_for_update().filter(name=name, tenant_id__in={tenant_id, ""})
        for row in existing:
            if row.source == DefSource.YAML:
                raise ChannelYamlImmutable(f'channel "{name}" is declared in yaml; it cannot be redeclared at runtime')
            if row.tenant_id == tenant_id:
                raise ChannelNameInUse(f'channel "{name}" already exists')
        return ChannelDef.objects.create(
            tenant_id=tenant_id,
            name=name,
            source=DefSource.RUNTIME,
            description=spec.description,
            scope=spec.scope,
            semantic=spec.semantic,
            default_ttl_seconds=spec.default_ttl or None,
            max_messages=spec.max_messages or None,
            publisher=spec.publisher,
            period=spec.period,
        )


def _runtime_row(tenant_id: str, name: str) -> ChannelDef:
    """The tenant's own runtime channel `name` (what PATCH and DELETE may change)."""
    rows = list(ChannelDef.objects.filter(name=name, tenant_id__in={tenant_id, ""}))
    if any(r.source == DefSource.YAML for r in rows):
        raise ChannelYamlImmutable(f'channel "{name}" is declared in yaml; change the yaml instead')
    for row in rows:
        if row.tenant_id == tenant_id:
            return row
    raise ChannelNotFound(f'channel "{name}" not found')


def channel_update(*, tenant_id: str, name: str, changes: dict[str, Any]) -> ChannelDef:
    """PATCH: description, semantic, default_ttl, max_messages of a runtime channel (0 = none)."""
    row = _runtime_row(tenant_id, name)
    if changes.get("description") is not None:
        row.description = changes["description"]
    if changes.get("semantic") is not None:
        row.semantic = changes["semantic"]
    if changes.get("default_ttl") is not None:
        row.default_ttl_seconds = changes["default_ttl"] or None
    if changes.get("max_messages") is not None:
        row.max_messages = changes["max_messages"] or None
    row.save()
    return row


def channel_delete(*, tenant_id: str, name: str) -> None:
    row = _runtime_row(tenant_id, name)
    with transaction.atomic():
        ChannelMessage.objects.filter(tenant_id=tenant_id, channel=name).delete()
        ChannelCursor.objects.filter(tenant_id=tenant_id, channel=name).delete()
        row.delete()


def channel_purge(*, tenant_id: str, name: str) -> dict[str, Any]:
    channel_get(tenant_id=tenant_id, name=name)
    purged, _ = ChannelMessage.objects.filter(tenant_id=tenant_id, channel=name).delete()
    return {"name": name, "purged": purged}


# --- publish ----------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    stream: Stream
    message_id: str
    published_at: datetime
    visible_at: datetime
    deferred: bool
    dropped_oldest: int
    payload_bytes: int

    def as_tool(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "channel": self.stream.channel,
            "message_id": self.message_id,
            "dropped_oldest": self.dropped_oldest,
        }
        if self.deferred:
            out["visible_at"] = ts(self.visible_at)
        return out

    def as_rest(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "msg_id": self.message_id,
            "channel": self.stream.channel,
            "created_at": ts(self.published_at),
            "dropped_oldest": self.dropped_oldest,
        }
        if self.deferred:
            out["visible_at"] = ts(self.visible_at)
        return out


def payload_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def check_payload(value: Any) -> int:
    size = payload_size(value)
    cap = settings.LOOMCYCLE.channels_max_value_bytes
    if cap and size > cap:
        raise ChannelValueTooLarge(f"payload ({size} bytes) exceeds max {cap} bytes")
    return size


def parse_deliver_at(raw: Any) -> datetime | None:
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise Invalid("deliver_at must be an RFC 3339 timestamp string", code="invalid_deliver_at")
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise Invalid(f"invalid deliver_at {raw!r} (expected RFC 3339)", code="invalid_deliver_at") from exc
    if moment.tzinfo is None:
        raise Invalid(f"invalid deliver_at {raw!r}: a time zone is required (RFC 3339)", code="invalid_deliver_at")
    return moment


def publish(
    *,
    stream: Stream,
    declared: ChannelDef,
    value: Any,
    ttl: int | None = None,
    deliver_at: datetime | None = None,
    published_by: str = "",
    published_by_user_id: str = "",
    idempotency_key: str = "",
) -> Published:
    """Append one message; trims overflow. Wake-ups go out after the commit.
    With an `idempotency_key` already used (a redelivered tool call), the
    first message is returned and nothing is published again."""
    size = check_payload(value)
    ttl_s = ttl if ttl else declared.default_ttl_seconds
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)), clock_timestamp()", [stream.lock_key])
            now: datetime = cur.fetchone()[1]
        if idempotency_key:
            first = ChannelMessage.objects.filter(idempotency_key=idempotency_key).first()
            if first is not None:
                return Published(
                    stream, first.id, first.published_at, first.visible_at, first.visible_at > now, 0, size
                )
        deferred = deliver_at is not None and deliver_at > now
        visible = deliver_at if deferred and deliver_at is not None else now
        msg = ChannelMessage.objects.create(
            id=_new_message_id(now),
            payload=value,
            published_at=now,
            visible_at=visible,
            expires_at=now + timedelta(seconds=ttl_s) if ttl_s else None,
            published_by=published_by,
            published_by_user_id=published_by_user_id,
            idempotency_key=idempotency_key,
            **stream.filter(),
        )
        dropped = _trim(stream, declared.max_messages, msg.id)
        if deferred:  # parked readers of this stream wake when it becomes visible
            ChannelWait.objects.filter(
                tenant_id=stream.tenant_id, streams__contains=[stream.key], wake_at__gt=visible
            ).update(wake_at=visible)
        done = Published(stream, msg.id, now, visible, deferred, dropped, size)
        transaction.on_commit(lambda: after_publish(done))
    return done


def broadcast(
    *,
    targets: list[tuple[Stream, ChannelDef]],
    value: Any,
    ttl: int | None,
    deliver_at: datetime | None,
    published_by: str,
    published_by_user_id: str,
    idempotency_key: str = "",
) -> list[tuple[Stream, Published | ApplicationError]]:
    """Publish `value` to each (already resolved and allowed) target, one
    transaction each; a failure is reported for its channel, the others go on."""
    out: list[tuple[Stream, Published | ApplicationError]] = []
    for stream, declared in targets:
        try:
            done = publish(
                stream=stream,
                declared=declared,
                value=value,
                ttl=ttl,
                deliver_at=deliver_at,
                published_by=published_by,
                published_by_user_id=published_by_user_id,
                idempotency_key=f"{idempotency_key}:{stream.channel}" if idempotency_key else "",
            )
        except ApplicationError as exc:
            out.append((stream, exc))
            continue
        out.append((stream, done))
    return out


def _trim(stream: Stream, keep: int | None, just_inserted: str) -> int:
    if not keep:
        return 0
    with connection.cursor() as cur:
        cur.execute(
            """
            DELETE FROM agent_channels_channelmessage WHERE id IN (
              SELECT id FROM agent_channels_channelmessage
              WHERE tenant_id = %s AND channel = %s AND scope = %s AND scope_id = %s
              ORDER BY visible_at DESC, id DESC OFFSET %s
            ) AND id <> %s
            """,
            [stream.tenant_id, stream.channel, stream.scope, stream.scope_id, keep, just_inserted],
        )
        return int(cur.rowcount)


def after_publish(done: Published) -> None:
    """Ring live readers, answer parked runs waiting on the stream (if visible now)."""
    from apps.channels.waits import waits_answer_stream

    sync_client().publish(bell(done.stream.tenant_id, done.stream.channel), done.message_id)
    if not done.deferred:
        waits_answer_stream(done.stream)


# --- reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    stream: Stream
    messages: list[dict[str, Any]]  # {id, value, published_at}
    next_cursor: str  # "" when nothing was read
    cursors: tuple[str, ...] = ()  # each message's own cursor

    def as_result(self) -> dict[str, Any]:
        return {"channel": self.stream.channel, "messages": self.messages, "next_cursor": self.next_cursor}


_READ_SQL = """
SELECT id, payload, published_at, visible_at FROM agent_channels_channelmessage
WHERE tenant_id = %s AND channel = %s AND scope = %s AND scope_id = %s
  AND visible_at <= now() AND (expires_at IS NULL OR expires_at > now())
  AND (visible_at, id) > (%s, %s)
ORDER BY visible_at, id
LIMIT %s
"""
_BEFORE_ALL = Position(EPOCH, "")


def _read(stream: Stream, after: Position | None, limit: int) -> Read:
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


_LOCK_CURSOR_SQL = """
INSERT INTO agent_channels_channelcursor AS c (tenant_id, channel, scope, scope_id, cursor, updated_at)
VALUES (%s, %s, %s, %s, '', now())
ON CONFLICT (tenant_id, channel, scope, scope_id) DO UPDATE SET cursor = c.cursor
RETURNING c.cursor
"""


def _committed(stream: Stream, *, lock: bool) -> str:
    """The stream's committed cursor ("" = from the oldest). With `lock`, the
    cursor row is created if absent and locked until the transaction ends, in
    one statement (readers of one stream are serialised on it)."""
    if lock:
        with connection.cursor() as cur:
            cur.execute(_LOCK_CURSOR_SQL, [stream.tenant_id, stream.channel, stream.scope, stream.scope_id])
            return str(cur.fetchone()[0])
    return ChannelCursor.objects.filter(**stream.filter()).values_list("cursor", flat=True).first() or ""


def clamp_max(value: Any) -> int:
    if value is None:
        return MAX_MESSAGES_DEFAULT
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid("max_messages must be an integer", code="invalid_max_messages")
    return MAX_MESSAGES_DEFAULT if value <= 0 else min(value, MAX_MESSAGES_CAP)


def subscribe(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Read after `from_cursor` (default: the committed cursor) and commit the
    cursor past what was read before returning (at most once)."""
    start = decode_cursor(from_cursor)
    with transaction.atomic():
        committed = _committed(stream, lock=True)
        read = _read(stream, start if from_cursor is not None else decode_cursor(committed), max_messages)
        if read.next_cursor and read.next_cursor > committed:
            ChannelCursor.objects.filter(**stream.filter()).update(cursor=read.next_cursor, updated_at=timezone.now())
    return read


def peek(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Non-committing; without `from_cursor` it reads from the oldest."""
    return _read(stream, decode_cursor(from_cursor), max_messages)


def pending(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Non-committing read after `from_cursor` or else the committed cursor (await)."""
    start = from_cursor if from_cursor is not None else _committed(stream, lock=False)
    return _read(stream, decode_cursor(start), max_messages)


def ack(*, stream: Stream, cursor: Any) -> dict[str, Any]:
    if cursor is None:
        raise Invalid("missing required field: cursor", code="missing_cursor")
    decode_cursor(cursor)
    if cursor in OLDEST_CURSORS:
        # `cur_0` is the position before every message: older than any committed cursor,
        # so acking it is a regression once one exists (as loomcycle answers), a no-op before.
        if _committed(stream, lock=False):
            raise ChannelCursorRegression("ack cursor older than committed")
        return {"ok": True}
    with transaction.atomic():
        committed = _committed(stream, lock=True)
        if cursor < committed:
            raise ChannelCursorRegression("ack cursor older than committed")
        if cursor != committed:
            ChannelCursor.objects.filter(**stream.filter()).update(cursor=cursor, updated_at=timezone.now())
    return {"ok": True}


MODES = ("any", "all", "at_least")


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


def await_read(
    *, streams: Iterable[tuple[Stream, str | None]], spec: AwaitSpec, timed_out: bool
) -> tuple[bool, dict[str, Any]]:
    """One non-committing read of every stream; (satisfied, the await result)."""
    reads = [pending(stream=s, from_cursor=c, max_messages=spec.max_messages) for s, c in streams]
    total = sum(len(r.messages) for r in reads)
    fired = [r.stream.channel for r in reads if r.messages]
    if spec.mode == "any":
        satisfied = bool(fired)
    elif spec.mode == "all":
        satisfied = len(fired) == len(reads)
    else:
        satisfied = total >= spec.n
    result = {
        "satisfied": satisfied,
        "timed_out": timed_out and not satisfied,
        "mode": spec.mode,
        "fired": fired,
        "total_messages": total,
        "results": {r.stream.channel: {"messages": r.messages, "next_cursor": r.next_cursor} for r in reads},
    }
    return satisfied, result


def dedupe(names: Any, prefix: str) -> list[str]:
    if not isinstance(names, list) or not names:
        raise Invalid(f"{prefix}missing required field: channels (non-empty list)", code="missing_channels")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise Invalid(f"{prefix}channels must be non-empty strings", code="invalid_channels")
        if name not in out:
            out.append(name)
    if len(out) > MAX_FANOUT:
        raise Invalid(f"{prefix}too many channels ({len(out)} > max {MAX_FANOUT})", code="too_many_channels")
    return out


# --- maintenance ------------------------------------------------------------------


def channels_expired_sweep() -> int:
    """Delete expired messages in batches (they are already invisible to reads)."""
    total = 0
    while True:
        ids = list(
            ChannelMessage.objects.filter(expires_at__lt=timezone.now()).values_list("id", flat=True)[:SWEEP_BATCH]
        )
        if not ids:
            return total
        deleted, _ = ChannelMessage.objects.filter(id__in=ids).delete()
        total += deleted


# --- what the Channel tool and parked answers report --------------------------------


def result_text(out: dict[str, Any]) -> str:
    """Tool results as loomcycle writes them: compact JSON, keys sorted."""
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _preview(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)[:200]


def publish_event(done: Published, value: Any) -> dict[str, Any]:
    return {
        "type": "channel_publish",
        "channel": {
            "channel": done.stream.channel,
            "message_id": done.message_id,
            "scope": done.stream.scope,
            "scope_id": done.stream.scope_id,
            "payload_bytes": done.payload_bytes,
            "payload_preview": _preview(value),
            "dropped_oldest": done.dropped_oldest,
        },
    }


def delivery_events(read: Read) -> list[dict[str, Any]]:
    """One `channel_delivery` event per message a subscribe delivered (SPEC 3.3)."""
    return [
        {
            "type": "channel_delivery",
            "channel": {
                "channel": read.stream.channel,
                "message_id": m["id"],
                "scope": read.stream.scope,
                "scope_id": read.stream.scope_id,
                "payload_preview": _preview(m["value"]),
                "cursor": cursor,
            },
        }
        for m, cursor in zip(read.messages, read.cursors, strict=True)
    ]
