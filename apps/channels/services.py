"""Channel writes (SPEC 6.3, 9.4): publish, broadcast, purge, the expiry sweep, and
runtime channel CRUD. The cursor writes (subscribe: the read that commits the cursor; ack)
are in `cursors`, reads in `selectors`, wire shapes in `presenters`, stream resolution
for the transports in `access`.

Invariants:
- Publishes to one stream are serialised by a transaction-scoped advisory
  lock taken BEFORE the publish time is read (from Postgres' clock), so the
  order of (visible_at, id) is the order of commits. A reader that has seen a
  message has therefore seen every message ordered before it, and a cursor
  never skips a message that commits late. A `deliver_at` in the future is
  the message's visible_at; one already past counts as immediate.
- Overflow beyond the channel's `max_messages` is trimmed, oldest first, in
  the publishing transaction.
- After a publish commits: stream readers are rung (Redis pub/sub, at most
  once: readers re-read Postgres) and parked runs waiting on the stream are
  answered (apps.channels.waits).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from redis import RedisError

from apps.channels.errors import ChannelValueTooLarge
from apps.channels.models import ChannelCursor, ChannelMessage, ChannelWait
from apps.channels.selectors import channel_get
from apps.channels.streams import Published, Stream, bell, new_message_id
from apps.channels.waits import waits_answer_stream
from apps.core.errors import ApplicationError, Invalid
from apps.core.redis import sync_client
from apps.substrate import channeldefs
from apps.substrate.models import ChannelDef

log = logging.getLogger("loomcycle.channels")

SWEEP_BATCH = 1000

# --- declarations -----------------------------------------------------------------
# The declarations (ChannelDef) are substrate's rows, written by apps.substrate.channeldefs:
# REST calls it to create and change them; deleting one takes its messages and cursors along.


def channel_delete(*, tenant_id: str, name: str) -> None:
    row = channeldefs.channeldef_runtime(tenant_id=tenant_id, name=name)
    with transaction.atomic():
        ChannelMessage.objects.filter(tenant_id=tenant_id, channel=name).delete()
        ChannelCursor.objects.filter(tenant_id=tenant_id, channel=name).delete()
        channeldefs.channeldef_delete(row)


def channel_purge(*, tenant_id: str, name: str) -> dict[str, Any]:
    channel_get(tenant_id=tenant_id, name=name)
    purged, _ = ChannelMessage.objects.filter(tenant_id=tenant_id, channel=name).delete()
    return {"name": name, "purged": purged}


# --- publish ----------------------------------------------------------------------


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
            id=new_message_id(now),
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
    transaction each; a failure is reported for its channel, the others go on.
    An oversized payload is refused before anything is published."""
    check_payload(value)
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
    """Answer parked runs waiting on the stream (if visible now), then ring live readers.
    The waits come first: they are rows, and their answer must not depend on Redis. The
    ring is at most once (readers re-poll Postgres), so a Redis error is logged, not raised:
    the message is committed and the publish succeeded."""
    if not done.deferred:
        waits_answer_stream(done.stream)
    try:
        sync_client().publish(bell(done.stream.tenant_id, done.stream.channel), done.message_id)
    except RedisError as exc:
        log.warning(
            "channel %s: message %s committed, live readers not rung: %s", done.stream.channel, done.message_id, exc
        )


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
