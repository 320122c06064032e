"""The spend guard (apps.core.spend.Guard) over Postgres: exact, cluster-wide.

Invariants:
- A provider call starts only after it reserved one unit (1 token; 0.000001 USD
  for a cost limit) on every hard limit in scope, by a conditional UPDATE
  `WHERE used + held < hard_limit` on the window's row: under the row lock
  Postgres takes for it, two workers cannot both take the last unit.
- What a call spent is added to `used` (and its reservation removed) when it
  settles: a run's step right after its commit, from the ledger rows that very
  commit wrote (`UsageEntry(run_id, step)`), so a step that never committed
  adds nothing; a gateway call from its reported usage.
- Hence the bound: a hard limit is exceeded by at most one provider call per
  call in flight (each passed while `used < hard`), and when fewer units remain
  than calls are in flight, only that many pass.
- Holds left by a lost worker are settled the same way by the next attempt of
  the run's step, or by the beat sweep once older than two leases.
- Every transaction here locks window rows in window id order (the reservation's
  and the settle's UPDATEs), and a settle locks only its own hold rows first, so
  two of them never wait on each other in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from apps.budgets.models import Kind, LimitHold, LimitWindow, OnExceed, Scope, TokenLimit
from apps.budgets.windows import window_end, window_label, window_start
from apps.core.spend import Crossing, Spender, Verdict
from apps.gateway.models import UsageEntry

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


def crossing(limit: TokenLimit, used: Decimal, severity: str, start: datetime) -> Crossing:
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
        resume_at=window_end(limit.window, limit.window_hours, start),
    )


def _text(value: Decimal | int) -> str:
    return format(Decimal(value).normalize(), "f")


def amount_of(kind: str, usage: dict[str, Any], cost_usd: Decimal | str | None) -> Decimal:
    """What one call spent on a limit of `kind` (an unpriced call adds no cost)."""
    if kind == Kind.COST:
        return Decimal(cost_usd) if cost_usd is not None else Decimal(0)
    cached = int(usage.get("cache_creation_input_tokens", 0)) + int(usage.get("cache_read_input_tokens", 0))
    inp, out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return Decimal({Kind.INPUT: inp + cached, Kind.OUTPUT: out}.get(kind, inp + out + cached))  # type: ignore[call-overload]


def _windows(limits: list[TokenLimit], now: datetime, *, create: bool) -> dict[int, LimitWindow]:
    """{limit id: its current window row}; missing rows created when `create`."""
    starts = {lim.id: window_start(lim.window, lim.window_hours, now) for lim in limits}
    if create:
        rows = [LimitWindow(limit_id=lid, start=s) for lid, s in starts.items()]
        LimitWindow.objects.bulk_create(rows, ignore_conflicts=True)
    q = Q(pk__in=[])
    for lid, s in starts.items():
        q |= Q(limit_id=lid, start=s)
    return {w.limit_id: w for w in LimitWindow.objects.filter(q)}


def admit(spender: Spender, now: datetime | None = None) -> Verdict:
    """Admission: refused when a hard limit's window is already spent (no reservation taken)."""
    now = now or timezone.now()
    limits = limits_for(spender)
    verdict = Verdict()
    if not limits:
        return verdict
    windows = _windows(limits, now, create=False)
    for lim in limits:
        w = windows.get(lim.id)
        used = w.used if w else Decimal(0)
        start = w.start if w else window_start(lim.window, lim.window_hours, now)
        if lim.hard_limit is not None and used >= lim.hard_limit and verdict.hard is None:
            verdict.hard = crossing(lim, used, "hard", start)
        elif lim.soft_limit is not None and used >= lim.soft_limit:
            verdict.soft.append(crossing(lim, used, "soft", start))
    return verdict


@dataclass
class _Refused(Exception):
    crossing: Crossing


def hold(*, key: str, step: int | None, spender: Spender, now: datetime | None = None) -> Verdict:
    """Before a provider call: settle what `key` left unsettled, then reserve on every limit in scope.
    `verdict.hard` set = refused, nothing reserved. `verdict.held` says whether any hold exists now."""
    now = now or timezone.now()
    limits = limits_for(spender)
    if not limits:
        return Verdict()
    with transaction.atomic():  # its own transaction: its window locks are released before the reservation's
        settle_key(key)
    try:
        with transaction.atomic():
            return _reserve(key, step, limits, now)
    except _Refused as refused:
        return Verdict(hard=refused.crossing, held=True)


def _reserve(key: str, step: int | None, limits: list[TokenLimit], now: datetime) -> Verdict:
    windows = _windows(limits, now, create=True)
    verdict, holds = Verdict(held=True), []
    with connection.cursor() as cur:
        for lim in sorted(limits, key=lambda lim: windows[lim.id].id):  # window id order: see settle_key
            w = windows[lim.id]
            unit = _UNIT.get(lim.kind, _TOKENS) if lim.hard_limit is not None else Decimal(0)
            if lim.hard_limit is not None:
                cur.execute(
                    f"UPDATE {LimitWindow._meta.db_table} SET held = held + %s WHERE id = %s "
                    "AND used + held < %s RETURNING used",
                    [unit, w.id, lim.hard_limit],
                )
                if cur.fetchone() is None:
                    raise _Refused(crossing(lim, w.used, "hard", w.start))
            if lim.soft_limit is not None and w.used >= lim.soft_limit:
                verdict.soft.append(crossing(lim, w.used, "soft", w.start))
            holds.append(LimitHold(key=key, window_id=w.id, amount=unit, step=step, created_at=now))
    LimitHold.objects.bulk_create(holds)
    return verdict


def settle_key(key: str, spent: dict[int | None, tuple[dict[str, Any], Decimal | None]] | None = None) -> int:
    """Inside a transaction: add what `key`'s held calls spent to their windows and drop the holds.
    `spent` maps a step to (usage, cost); None reads a run's ledger rows per held step."""
    # Only the hold rows are locked here (`of=self`): the windows are locked by their UPDATEs
    # below, in window id order, the one order every writer of windows takes (no deadlock).
    holds = list(LimitHold.objects.select_for_update(of=("self",)).filter(key=key).select_related("window__limit"))
    if not holds:
        return 0
    if spent is None:
        spent = _ledger(key.removeprefix("run:"), {h.step for h in holds})
    with connection.cursor() as cur:
        for h in sorted(holds, key=lambda h: h.window_id):
            usage, cost = spent.get(h.step, ({}, None))
            add = amount_of(h.window.limit.kind, usage, cost)
            cur.execute(
                f"UPDATE {LimitWindow._meta.db_table} SET used = used + %s, held = held - %s WHERE id = %s",
                [add, h.amount, h.window_id],
            )
    LimitHold.objects.filter(id__in=[h.id for h in holds]).delete()
    return len(holds)


def _ledger(run_id: str, steps: set[int | None]) -> dict[int | None, tuple[dict[str, Any], Decimal | None]]:
    rows = (
        UsageEntry.objects.filter(run_id=run_id, step__in=[s for s in steps if s is not None])
        .values("step")
        .annotate(
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cache_creation_input_tokens=Sum("cache_creation_input_tokens"),
            cache_read_input_tokens=Sum("cache_read_input_tokens"),
            cost=Sum("cost_usd"),
        )
        .order_by()
    )
    return {r["step"]: (dict(r), r["cost"]) for r in rows}


def settle_run(*, run_id: str) -> None:
    with transaction.atomic():
        settle_key(f"run:{run_id}")


def settle_call(*, key: str, usage: dict[str, Any], cost_usd: str | None) -> None:
    with transaction.atomic():
        settle_key(key, {None: (usage, Decimal(cost_usd) if cost_usd is not None else None)})


def holds_sweep(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Settle the holds a lost worker left (runs from their ledger rows; a gateway call's as nothing spent)."""
    cutoff = (now or timezone.now()) - older_than
    keys = set(LimitHold.objects.filter(created_at__lt=cutoff).values_list("key", flat=True)[:1000])
    settled = 0
    for key in sorted(keys):
        with transaction.atomic():
            settled += settle_key(key, None if key.startswith("run:") else {})
    return settled


def is_defer(verdict: Verdict) -> bool:
    return verdict.hard is not None and verdict.hard.on_exceed == OnExceed.DEFER
