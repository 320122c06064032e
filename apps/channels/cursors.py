"""Channel cursor writes (SPEC 6.3): subscribe, the read that commits a stream's cursor,
and ack. Parked Channel calls answer through `subscribe` too (apps.channels.waits), so
these sit below both the services and the waits.

Invariants:
- `subscribe` commits the cursor in the transaction that reads (at most once
  per stream: readers of one stream are serialised on the cursor row); the
  cursor only moves forward. `ack` refuses a regression (409).
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.channels.errors import ChannelCursorRegression
from apps.channels.models import ChannelCursor
from apps.channels.selectors import committed_cursor, stream_read
from apps.channels.streams import OLDEST_CURSORS, Read, Stream, decode_cursor
from apps.core.errors import Invalid

_LOCK_CURSOR_SQL = """
INSERT INTO agent_channels_channelcursor AS c (tenant_id, channel, scope, scope_id, cursor, updated_at)
VALUES (%s, %s, %s, %s, '', now())
ON CONFLICT (tenant_id, channel, scope, scope_id) DO UPDATE SET cursor = c.cursor
RETURNING c.cursor
"""


def _committed_locked(stream: Stream) -> str:
    """The stream's committed cursor ("" = from the oldest); the cursor row is
    created if absent and locked until the transaction ends, in one statement
    (readers of one stream are serialised on it)."""
    with connection.cursor() as cur:
        cur.execute(_LOCK_CURSOR_SQL, [stream.tenant_id, stream.channel, stream.scope, stream.scope_id])
        return str(cur.fetchone()[0])


def subscribe(*, stream: Stream, from_cursor: str | None, max_messages: int) -> Read:
    """Read after `from_cursor` (default: the committed cursor) and commit the
    cursor past what was read before returning (at most once)."""
    start = decode_cursor(from_cursor)
    with transaction.atomic():
        committed = _committed_locked(stream)
        read = stream_read(stream, start if from_cursor is not None else decode_cursor(committed), max_messages)
        if read.next_cursor and read.next_cursor > committed:
            ChannelCursor.objects.filter(**stream.filter()).update(cursor=read.next_cursor, updated_at=timezone.now())
    return read


def ack(*, stream: Stream, cursor: Any) -> dict[str, Any]:
    if cursor is None:
        raise Invalid("missing required field: cursor", code="missing_cursor")
    decode_cursor(cursor)
    if cursor in OLDEST_CURSORS:
        # `cur_0` is the position before every message: older than any committed cursor,
        # so acking it is a regression once one exists (as loomcycle answers), a no-op before.
        if committed_cursor(stream):
            raise ChannelCursorRegression("ack cursor older than committed")
        return {"ok": True}
    with transaction.atomic():
        committed = _committed_locked(stream)
        if cursor < committed:
            raise ChannelCursorRegression("ack cursor older than committed")
        if cursor != committed:
            ChannelCursor.objects.filter(**stream.filter()).update(cursor=cursor, updated_at=timezone.now())
    return {"ok": True}
