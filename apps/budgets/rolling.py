"""Rolling N-hour windows, exact and cluster-wide (issue 37).

A rolling limit keeps one window row for ever: its `used` only grows (everything the
scope ever spent) and its `held` is what calls in flight reserved, as for a calendar
window. Each settle that adds spend writes a `LimitSpend(window, at, total)` row in the
same statement that moves `used`, under the window row's lock, so stamps and totals
both only grow (the stamp is `GREATEST(last_at, now)`). The spend of the last N hours
at instant t is then

    used - total(latest LimitSpend with at <= t - N hours)

one backward probe of the index (window, at, total), whatever the window's traffic.
The reservation is the calendar windows' conditional UPDATE with that term subtracted,
so two workers still cannot both take the last unit: the row lock serialises them and
the aged-out total can only grow between them (rows that old committed long before).

A spend counts from the moment it settles (the run's next gate, park or end, right
after its step's commit; a gateway call when it finishes) for exactly N hours."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection

from apps.budgets.models import LimitSpend, LimitWindow, TokenLimit, Window

_W, _S = LimitWindow._meta.db_table, LimitSpend._meta.db_table


def aged_out(window: str, cutoff: str) -> str:
    """SQL: the running total of `window` at or before `cutoff` (what no longer counts)."""
    return (
        f"COALESCE((SELECT s.total FROM {_S} s WHERE s.window_id = {window} AND s.at <= {cutoff}"
        " ORDER BY s.at DESC, s.total DESC LIMIT 1), 0)"
    )


AGED_SQL = f"SELECT {aged_out('%(w)s', '%(c)s')}"

# Settle (`add`) and reserve (`unit`) on a rolling window in one statement: refused (no row)
# when a hard limit is given and the last N hours' spend and holds reach it.
MOVE_SQL = f"""WITH u AS (UPDATE {_W} SET used = used + %(add)s, held = held - %(rel)s + %(unit)s,
    last_at = CASE WHEN %(add)s > 0 THEN GREATEST(last_at, %(now)s) ELSE last_at END
  WHERE id = %(w)s AND (%(hard)s::numeric IS NULL
    OR used + %(add)s + held - %(rel)s - {aged_out("%(w)s", "%(c)s")} < %(hard)s)
  RETURNING id, used, last_at),
i AS (INSERT INTO {_S} (window_id, at, total) SELECT id, last_at, used FROM u WHERE %(add)s > 0)
SELECT used FROM u"""

# The first spend still counted whose ageing out brings the window's spend under `hard` (any, when NULL).
_RESUME_SQL = f"""SELECT s.at FROM {_S} s JOIN {_W} w ON w.id = s.window_id
  WHERE w.id = %(w)s AND s.at > %(c)s AND (%(hard)s::numeric IS NULL OR s.total > w.used - %(hard)s)
  ORDER BY s.at, s.total LIMIT 1"""

# Every row older than the newest one a cutoff to come can still ask for.
_PRUNE_SQL = f"""DELETE FROM {_S} s USING {_W} w, {TokenLimit._meta.db_table} l
  WHERE w.id = s.window_id AND l.id = w.limit_id AND l."window" = '{Window.HOURS.value}'
    AND s.at < (SELECT max(k.at) FROM {_S} k WHERE k.window_id = s.window_id
                AND k.at <= %(now)s - make_interval(hours => l.window_hours))"""


def is_rolling(limit: TokenLimit) -> bool:
    return limit.window == Window.HOURS


def cutoff(limit: TokenLimit, now: datetime) -> datetime | None:
    """Spend stamped at or before this no longer counts (None: a calendar window)."""
    return now - timedelta(hours=max(limit.window_hours, 1)) if is_rolling(limit) else None


def resume_at(limit: TokenLimit, window_id: int | None, now: datetime) -> datetime:
    """When enough of the window's spend has aged out for its hard limit to admit again
    (a limit of 0 never does: then N hours from now, when the wake looks again)."""
    return _first_ageing(limit, window_id, now, limit.hard_limit if limit.hard_limit is not None else Decimal(0))


def next_drop(limit: TokenLimit, window_id: int | None, now: datetime) -> datetime:
    """When the oldest spend still counted ages out (N hours from now when none counts)."""
    return _first_ageing(limit, window_id, now, None)


def _first_ageing(limit: TokenLimit, window_id: int | None, now: datetime, hard: Decimal | None) -> datetime:
    span = timedelta(hours=max(limit.window_hours, 1))
    if window_id is None:
        return now + span
    with connection.cursor() as cur:
        cur.execute(_RESUME_SQL, {"w": window_id, "hard": hard, "c": now - span})
        row = cur.fetchone()
    return row[0] + span if row else now + span


def prune(now: datetime) -> int:
    """Drop the spend rows no cutoff can ask for again (beat, with the holds sweep)."""
    with connection.cursor() as cur:
        cur.execute(_PRUNE_SQL, {"now": now})
        return int(cur.rowcount)
