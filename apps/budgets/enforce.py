"""The spend guard (apps.core.spend.Guard) over Postgres: exact, cluster-wide.

Invariants:
- A provider call starts only after it reserved one unit (1 token; 0.000001 USD
  for a cost limit) on every hard limit in scope, by a conditional UPDATE
  `WHERE used + held < hard_limit` on the window's row: under the row lock
  Postgres takes for it, two workers cannot both take the last unit.
- What a call spent is added to `used` (and its reservation removed) when it
  settles, from the ledger rows its step's commit wrote (`UsageEntry(run_id,
  step)`), so a step that never committed adds nothing: a run going on settles
  its previous call in the transaction that reserves for its next one (its gate,
  apps.budgets.hot); a park or an end settles right after its commit; a gateway
  call settles from its reported usage when it finishes.
- Hence the bound: a hard limit is exceeded by at most one provider call per
  run in flight (a run is in flight from one gate to its next gate, park or end:
  each call passed while `used + held < hard`), and when fewer units remain than
  runs are in flight, only that many pass.
- Holds left by a lost worker are settled the same way by the next attempt of
  the run's step, or by the beat sweep once older than two leases.
- Every transaction here locks window rows in window id order, one single-row
  UPDATE each, one pass (apps.budgets.hot), and hold rows are per key, so two of
  them never wait on each other in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.budgets import hot, limitcache, rolling
from apps.budgets.models import Kind, LimitHold, OnExceed, Scope, TokenLimit
from apps.budgets.windows import window_end, window_label, window_start
from apps.core.spend import Crossing, Spender, Verdict

_UNIT = {Kind.COST.value: Decimal("0.000001")}
_TOKENS = Decimal(1)


def limits_for(spender: Spender) -> list[TokenLimit]:
    """Every limit in scope of `spender`, ordered by id (the lock order)."""
    q = Q(scope=Scope.OPERATOR) | Q(tenant_id=spender.tenant_id, scope=Scope.TENANT)
    if spender.user_id:
        q |= Q(tenant_id=spender.tenant_id, scope=Scope.USER, scope_id=spender.user_id)
    if spender.agent:
        q |= Q(tenant_id=spender.tenant_id, scope=Scope.AGENT, scope_id=spender.agent)
    return list(TokenLimit.objects.filter(q).order_by("id"))


def crossing(
    limit: TokenLimit, used: Decimal, severity: str, start: datetime, *, window_id: int | None = None, now: datetime
) -> Crossing:
    """`resume_at`: a calendar window's end; for a rolling one, when enough spend has aged out (a
    hard crossing reads it from the window's spend rows; a soft one says when the oldest ages out)."""
    threshold = limit.hard_limit if severity == "hard" else limit.soft_limit
    label = window_label(limit.window, limit.window_hours)
    who = f"{limit.scope} {limit.scope_id or limit.tenant_id}".strip()
    return Crossing(
        limit_id=limit.id,
        scope=limit.scope,
        scope_id=limit.scope_id if limit.scope in (Scope.USER, Scope.AGENT) else limit.tenant_id,
        severity=severity,
        window=label,
        kind=limit.kind,
        used=_text(used),
        limit=_text(threshold or Decimal(0)),
        message=f"{who} {severity} {limit.kind} budget reached: {_text(used)} of {_text(threshold or 0)} this {label}",
        on_exceed=limit.on_exceed,
        resume_at=_resume_at(limit, severity, start, window_id, now),
    )


def _resume_at(limit: TokenLimit, severity: str, start: datetime, window_id: int | None, now: datetime) -> datetime:
    if not rolling.is_rolling(limit):
        return window_end(limit.window, limit.window_hours, start)
    if severity == "hard":
        return rolling.resume_at(limit, window_id, now)
    return now + timedelta(hours=max(limit.window_hours, 1))


def _text(value: Decimal | int) -> str:
    return format(Decimal(value).normalize(), "f")


def amount_of(kind: str, usage: dict[str, Any], cost_usd: Decimal | str | None) -> Decimal:
    """What one call spent on a limit of `kind` (an unpriced call adds no cost)."""
    if kind == Kind.COST:
        return Decimal(cost_usd) if cost_usd is not None else Decimal(0)
    cached = int(usage.get("cache_creation_input_tokens", 0)) + int(usage.get("cache_read_input_tokens", 0))
    inp, out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return Decimal({Kind.INPUT: inp + cached, Kind.OUTPUT: out}.get(kind, inp + out + cached))  # type: ignore[call-overload]


def admit(spender: Spender, now: datetime | None = None) -> Verdict:
    """Admission: refused when a hard limit's window is already spent (no reservation taken)."""
    now = now or timezone.now()
    limits = limits_for(spender)
    verdict = Verdict()
    if not limits:
        return verdict
    windows = {w.limit.id: w for w in hot.windows_of(limits, now, create=False)}
    for lim in limits:
        w = windows.get(lim.id)
        used, wid = (w.used, w.id) if w else (Decimal(0), None)
        start = window_start(lim.window, lim.window_hours, now)
        if lim.hard_limit is not None and used >= lim.hard_limit and verdict.hard is None:
            verdict.hard = crossing(lim, used, "hard", start, window_id=wid, now=now)
        elif lim.soft_limit is not None and used >= lim.soft_limit:
            verdict.soft.append(crossing(lim, used, "soft", start, window_id=wid, now=now))
    return verdict


@dataclass
class _Refused(Exception):
    window: hot.Window


def unit_of(limit: TokenLimit) -> Decimal:
    """What a call reserves on a limit: one token (one micro-dollar for cost); nothing without a hard limit."""
    return _UNIT.get(limit.kind, _TOKENS) if limit.hard_limit is not None else Decimal(0)


def hold(
    *, key: str, step: int | None, spender: Spender, now: datetime | None = None, generation: int | None = None
) -> Verdict:
    """Before a provider call, one transaction: settle what `key`'s previous call spent, and reserve
    on every limit in scope. `verdict.hard` set = refused, nothing reserved (the settle still lands).
    `verdict.held` says whether budgets were in scope (a settle is owed). `generation`: the limits'
    generation the run's claim read (apps.budgets.limitcache; None reads the limits)."""
    now = now or timezone.now()
    limits = limitcache.limits_at(spender, generation)
    if not limits:  # (a deleted limit's holds went with it: ON DELETE CASCADE)
        return Verdict()
    try:
        with transaction.atomic():
            taken = hot.take_holds(key, None, lazy=key.startswith("run:"))
            windows = hot.windows_of(limits, now, hold=(key, step))
            refused = hot.reserve(windows, taken, now)
            if refused is not None:
                raise _Refused(refused)
    except _Refused as exc:  # rolled back: the previous call's settle lands on its own
        if key.startswith("run:"):
            settle_run(run_id=key.removeprefix("run:"), now=now)
        w = exc.window
        return Verdict(hard=crossing(w.limit, w.used, "hard", w.start, window_id=w.id, now=now), held=True)
    verdict = Verdict(held=True)
    for w in windows:
        used = w.used + taken.add.get(w.id, Decimal(0))
        if w.limit.soft_limit is not None and used >= w.limit.soft_limit:
            verdict.soft.append(crossing(w.limit, used, "soft", w.start, window_id=w.id, now=now))
    return verdict


def settle_key(
    key: str, spent: dict[int | None, tuple[dict[str, Any], Decimal | None]] | None = None, now: datetime | None = None
) -> int:
    """Inside a transaction: add what `key`'s held calls spent to their windows and drop the holds.
    `spent` maps a step to (usage, cost); None reads a run's ledger rows per held step. `now`
    stamps the spend on rolling windows."""
    taken = hot.take_holds(key, spent)
    hot.apply(taken, now or timezone.now())
    return len(taken.add)


def settle_run(*, run_id: str, now: datetime | None = None) -> None:
    with transaction.atomic():
        settle_key(f"run:{run_id}", now=now)


def settle_call(*, key: str, usage: dict[str, Any], cost_usd: str | None, now: datetime | None = None) -> None:
    with transaction.atomic():
        settle_key(key, {None: (usage, Decimal(cost_usd) if cost_usd is not None else None)}, now)


def holds_sweep(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Settle the holds a lost worker left (runs from their ledger rows; a gateway call's as nothing spent),
    and drop the rolling windows' spend rows no cutoff can ask for again."""
    now = now or timezone.now()
    rolling.prune(now)
    cutoff = now - older_than
    keys = set(LimitHold.objects.filter(created_at__lt=cutoff).values_list("key", flat=True)[:1000])
    settled = 0
    for key in sorted(keys):
        with transaction.atomic():
            settled += settle_key(key, None if key.startswith("run:") else {}, now)
    return settled


def is_defer(verdict: Verdict) -> bool:
    return verdict.hard is not None and verdict.hard.on_exceed == OnExceed.DEFER
