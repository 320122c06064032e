"""The per-iteration statements of the spend gate, in raw SQL (the ORM cost ~3x the
engine's own CPU per iteration in bench/budgets.py): one transaction per provider call
that settles the key's previous call and reserves for the next one.

Lock order: window rows are only ever locked by the single-row UPDATEs below, taken in
window id order, one pass per transaction; hold rows are per key (one run or one
gateway call), so two transactions never wait on each other in a cycle.

A rolling window (apps.budgets.rolling) takes the same path with one statement of its own
per window: the aged-out total subtracted in its condition, a spend row written with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from apps.budgets import rolling
from apps.budgets.models import LimitHold, LimitWindow, TokenLimit
from apps.budgets.models import Window as Span
from apps.budgets.windows import window_start
from apps.gateway.models import UsageEntry

_L, _W, _H, _U = (m._meta.db_table for m in (TokenLimit, LimitWindow, LimitHold, UsageEntry))
_LIMITS_SQL = f"""SELECT id, tenant_id, scope, scope_id, kind, "window", window_hours, soft_limit, hard_limit, on_exceed
  FROM {_L} WHERE scope = 'operator' OR (tenant_id = %(t)s AND (scope = 'tenant'
    OR (scope = 'user' AND scope_id = %(u)s AND %(u)s <> '') OR (scope = 'agent' AND scope_id = %(a)s AND %(a)s <> '')))
  ORDER BY id"""


def _windows_sql(*, hold: bool) -> str:
    """Each limit's current window (x: limit, start, cutoff, and with `hold` the unit to reserve);
    `used` is the window's spend, a rolling window's less what has aged out. With `hold` the same
    statement writes the key's hold rows (a re-run after creating windows adds the missing ones)."""
    unit, x, u = (", %(u)s::numeric[]", "x(l, s, c, u)", ", x.u") if hold else ("", "x(l, s, c)", "")
    select = f"""SELECT w.limit_id, w.id,
    w.used - CASE WHEN x.c IS NULL THEN 0 ELSE {rolling.aged_out("w.id", "x.c")} END AS used, w.held{u}
  FROM {_W} w JOIN unnest(%(l)s::bigint[], %(s)s::timestamptz[], %(c)s::timestamptz[]{unit}) AS {x}
  ON w.limit_id = x.l AND w.start = x.s"""
    if not hold:
        return select
    return f"""WITH w AS ({select}),
i AS (INSERT INTO {_H} (key, window_id, amount, step, created_at) SELECT %(k)s, w.id, w.u, %(step)s, %(now)s FROM w
  ON CONFLICT (key, window_id) DO NOTHING)
SELECT limit_id, id, used, held FROM w"""


_WINDOWS_SQL, _WINDOWS_HOLD_SQL = _windows_sql(hold=False), _windows_sql(hold=True)
# (only for limits that still exist: the gate's limits may come from apps.budgets.limitcache)
_CREATE_SQL = f"""INSERT INTO {_W} (limit_id, start, used, held)
  SELECT x.l, x.s, 0, 0 FROM unnest(%(l)s::bigint[], %(s)s::timestamptz[]) AS x(l, s) JOIN {_L} l ON l.id = x.l
  ON CONFLICT DO NOTHING"""
# The key's holds deleted, with what their steps' ledger rows spent (when `ledger`: a run's key).
# `lazy`: this transaction commits without waiting for its WAL flush (a run's gate: see take_holds).
_TAKE_SQL = f"""WITH s AS (SELECT set_config('synchronous_commit',
    CASE WHEN %(lazy)s THEN 'off' ELSE current_setting('synchronous_commit') END, true) AS v),
d AS (DELETE FROM {_H} h USING {_W} w, {_L} l
    WHERE h.key = %(k)s AND w.id = h.window_id AND l.id = w.limit_id
    RETURNING h.window_id, h.amount, h.step, l.kind, l."window" AS span),
g AS (SELECT step, sum(input_tokens) AS i, sum(output_tokens) AS o, sum(cache_creation_input_tokens) AS cw,
    sum(cache_read_input_tokens) AS cr, sum(cost_usd) AS cost FROM {_U}
  WHERE %(ledger)s AND run_id = %(run)s AND step IN (SELECT step FROM d) GROUP BY step)
SELECT d.window_id, d.amount, d.step, d.kind, d.span, g.i, g.o, g.cw, g.cr, g.cost, g.step IS NOT NULL
FROM s LEFT JOIN d ON true LEFT JOIN g ON g.step = d.step"""
_TOKENS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_MOVE_SQL = f"UPDATE {_W} SET used = used + %s, held = held - %s + %s WHERE id = %s"
_RESERVE_SQL = _MOVE_SQL + " AND used + %s + held - %s < %s RETURNING used"


@dataclass
class Window:
    limit: TokenLimit
    id: int
    used: Decimal
    start: datetime


def limits_of(tenant_id: str, user_id: str, agent: str) -> list[TokenLimit]:
    with connection.cursor() as cur:
        cur.execute(_LIMITS_SQL, {"t": tenant_id, "u": user_id, "a": agent})
        cols = ("id", "tenant_id", "scope", "scope_id", "kind", "window", "window_hours")
        return [
            TokenLimit(**dict(zip(cols, r[:7], strict=True)), soft_limit=r[7], hard_limit=r[8], on_exceed=r[9])
            for r in cur.fetchall()
        ]


def windows_of(
    limits: list[TokenLimit], now: datetime, *, create: bool = True, hold: tuple[str, int | None] | None = None
) -> list[Window]:
    """The current window of each limit (created when missing and `create`), in window id order;
    `used` is the window's spend (a rolling window's over its last N hours). `hold`: (key, step)
    whose hold rows (one unit per hard limit, apps.budgets.enforce.unit_of) the same statement writes."""
    from apps.budgets.enforce import unit_of

    starts = {lim.id: window_start(lim.window, lim.window_hours, now) for lim in limits}
    args: dict[str, Any] = {"l": list(starts), "s": list(starts.values())}
    args["c"] = [rolling.cutoff(lim, now) for lim in limits]
    if hold is not None:
        args |= {"u": [unit_of(lim) for lim in limits], "k": hold[0], "step": hold[1], "now": now}
    sql = _WINDOWS_SQL if hold is None else _WINDOWS_HOLD_SQL
    with connection.cursor() as cur:
        cur.execute(sql, args)
        rows = cur.fetchall()
        if create and len(rows) < len(limits):  # a window's first call (once per window and limit)
            cur.execute(_CREATE_SQL, args)
            cur.execute(sql, args)
            rows = cur.fetchall()
    by_id = {lim.id: lim for lim in limits}
    return sorted((Window(by_id[r[0]], r[1], r[2], starts[r[0]]) for r in rows), key=lambda w: w.id)


@dataclass
class Taken:
    """What a key's holds come to, per window: the spend to add and the reservation to release."""

    add: dict[int, Decimal] = field(default_factory=dict)
    release: dict[int, Decimal] = field(default_factory=dict)
    rolling: set[int] = field(default_factory=set)  # the windows of rolling limits


def take_holds(
    key: str, spent: dict[int | None, tuple[dict[str, Any], Decimal | None]] | None, *, lazy: bool = False
) -> Taken:
    """Delete `key`'s holds; their spend (`spent` by step, or a run's ledger rows when None), one statement.
    `lazy` (a run's gate, the transaction's first statement): its commit does not wait for the WAL
    flush, as the claim's does not. The run's step commit after it is synchronous and WAL is
    sequential, so when that commit survives a Postgres crash so does the gate; when it does not,
    the iteration repeats and its gate with it, and the previous step's spend (committed, in the
    ledger) is settled again from its restored holds. Nothing counted is lost."""
    from apps.budgets.enforce import amount_of

    taken = Taken()
    with connection.cursor() as cur:
        params: dict[str, Any] = {"k": key, "ledger": spent is None, "run": key.removeprefix("run:"), "lazy": lazy}
        cur.execute(_TAKE_SQL, params)
        holds = [h for h in cur.fetchall() if h[0] is not None]
    for window_id, amount, step, kind, span, *sums, in_ledger in holds:
        if span == Span.HOURS:
            taken.rolling.add(window_id)
        if spent is None:
            usage, cost = (dict(zip(_TOKENS, sums[:4], strict=True)), sums[4]) if in_ledger else ({}, None)
        else:
            usage, cost = spent.get(step, ({}, None))
        taken.add[window_id] = taken.add.get(window_id, Decimal(0)) + amount_of(kind, usage, cost)
        taken.release[window_id] = taken.release.get(window_id, Decimal(0)) + amount
    return taken


def apply(taken: Taken, now: datetime) -> None:
    """Settle only: one UPDATE per window, in id order."""
    with connection.cursor() as cur:
        for wid in sorted(taken.add):
            _move(cur, wid, taken.add[wid], taken.release[wid], Decimal(0), None, wid in taken.rolling, now)


def _move(
    cur: Any, wid: int, add: Decimal, rel: Decimal, unit: Decimal, w: Window | None, roll: bool, now: datetime
) -> bool:
    """Settle `add` (releasing `rel`) and reserve `unit` on one window; on `w`'s hard limit when it
    has one, conditionally. False: refused (nothing of this statement happened)."""
    hard = w.limit.hard_limit if w is not None else None
    if hard is None and add == 0 and rel == unit:  # nothing to settle, nothing to check: no row version
        return True
    if roll or (w is not None and rolling.is_rolling(w.limit)):
        cut = rolling.cutoff(w.limit, now) if w is not None else None
        params = {"add": add, "rel": rel, "unit": unit, "now": now, "w": wid, "hard": hard, "c": cut}
        cur.execute(rolling.MOVE_SQL, params)
        return cur.fetchone() is not None
    if hard is None:
        cur.execute(_MOVE_SQL, [add, rel, unit, wid])
        return True
    cur.execute(_RESERVE_SQL, [add, rel, unit, wid, add, rel, hard])
    return cur.fetchone() is not None


def reserve(windows: list[Window], taken: Taken, now: datetime) -> Window | None:
    """Settle `taken` and reserve one unit on every hard limit of `windows` (whose hold rows
    windows_of wrote), one pass in window id order. The window whose hard limit refused (the
    caller rolls the transaction back), or None."""
    from apps.budgets.enforce import unit_of

    units = {w.id: unit_of(w.limit) for w in windows}
    with connection.cursor() as cur:
        current = {w.id: w for w in windows}
        for wid in sorted(set(units) | set(taken.add)):
            add, rel, w = taken.add.get(wid, Decimal(0)), taken.release.get(wid, Decimal(0)), current.get(wid)
            if not _move(cur, wid, add, rel, units.get(wid, Decimal(0)), w, wid in taken.rolling, now) and w:
                w.used += add
                return w
    return None
