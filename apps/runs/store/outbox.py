"""The signal outbox's writes (part of apps/runs/store/, the one package that
writes the runs app's tables): a lifecycle signal's row inserted in its
transition's transaction, deleted once delivered, and claimed by the re-send
sweep (apps.runs.signals says when each happens)."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

_INSERT_SQL = (
    "INSERT INTO runs_signaloutbox (signal, run_id, kwargs, created_at)"
    " VALUES (%s, %s, %s::jsonb, clock_timestamp()) RETURNING id"
)

# Rows past the grace, never claimed or claimed a grace ago (that sweep died or is still sending), oldest
# first; SKIP LOCKED: concurrent sweeps take disjoint rows. The claim commits at once, so the receivers
# run outside any transaction, as after a transition's own commit.
_CLAIM_SQL = """
UPDATE runs_signaloutbox o SET claimed_at = now()
FROM (
  SELECT id FROM runs_signaloutbox
  WHERE created_at < now() - make_interval(secs => %(grace)s)
    AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => %(grace)s))
  ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.signal, o.kwargs
"""


def outbox_insert(*, signal: str, run_id: str, kwargs: dict[str, Any]) -> int:
    """The new row's id (the `delivery_id`). In the caller's transaction, so the row exists iff the
    transition commits. `created_at` is the moment of the insert on Postgres's clock (`clock_timestamp()`,
    not `now()`, the transaction's start): a long transaction's rows are not already past the re-send
    grace when it commits. One still open longer than the grace after the insert may see its rows
    re-sent by the sweep as it delivers them (at least once: receivers dedupe on `delivery_id`)."""
    with connection.cursor() as cur:
        cur.execute(_INSERT_SQL, [signal, run_id, json.dumps(kwargs)])
        (delivery_id,) = cur.fetchone()
    return int(delivery_id)


def outbox_delete(*, delivery_id: int) -> None:
    """Delivered: the row goes (a no-op if a sweep's re-send already deleted it)."""
    with connection.cursor() as cur:
        cur.execute("DELETE FROM runs_signaloutbox WHERE id = %s", [delivery_id])


def outbox_claim_due(*, grace_seconds: float, limit: int) -> list[tuple[int, str, dict[str, Any]]]:
    """Claim up to `limit` rows older than `grace_seconds` (see _CLAIM_SQL): (id, signal, kwargs), by id.
    A claimed row is not claimed again for another grace, so a sweep that dies mid-send loses nothing."""
    with connection.cursor() as cur:
        cur.execute(_CLAIM_SQL, {"grace": grace_seconds, "limit": limit})
        rows = cur.fetchall()
    decoded = [(int(i), str(s), k if isinstance(k, dict) else json.loads(k)) for i, s, k in rows]
    return sorted(decoded)
