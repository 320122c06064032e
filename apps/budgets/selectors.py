"""Reads: the limits a principal may see (with each one's use in its current
window), and the usage report (`GET /v1/_usage`, the admin page, the CLI).
The tenant is always an explicit keyword: None = every tenant (the operator)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from apps.budgets import hot, rolling
from apps.budgets.errors import InvalidLimit
from apps.budgets.models import TokenLimit
from apps.budgets.windows import window_end, window_start
from apps.gateway.models import UsageEntry
from apps.runs.selectors import run_agent_names

GROUPS = ("tenant", "user", "agent", "model", "provider", "day")
_COLUMN = {"tenant": "tenant_id", "user": "user_id", "model": "model", "provider": "provider", "day": "day"}
_SUMS = {
    "input_tokens": Sum("input_tokens"),
    "output_tokens": Sum("output_tokens"),
    "cache_creation_input_tokens": Sum("cache_creation_input_tokens"),
    "cache_read_input_tokens": Sum("cache_read_input_tokens"),
    "cost": Sum("cost_usd"),
    "calls": Count("id"),
    "priced": Count("cost_usd"),
}
TOKENS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@dataclass
class LimitView:
    row: TokenLimit
    used: Decimal
    window_start: datetime
    resets_at: datetime


def limits_list(*, tenant_id: str | None, now: datetime | None = None) -> list[LimitView]:
    """The limits of `tenant_id` (None: all, operator-global ones included), with current use.
    A rolling limit's window starts N hours ago and "resets" when its oldest counted spend ages out."""
    now = now or timezone.now()
    rows = TokenLimit.objects.order_by("tenant_id", "scope", "scope_id", "kind", "window")
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id).exclude(scope="operator")
    limits = list(rows)
    windows = {w.limit.id: w for w in hot.windows_of(limits, now, create=False)} if limits else {}
    return [_view(lim, windows.get(lim.id), now) for lim in limits]


def _view(lim: TokenLimit, window: hot.Window | None, now: datetime) -> LimitView:
    used = window.used if window else Decimal(0)
    if rolling.is_rolling(lim):
        start = rolling.cutoff(lim, now) or now
        return LimitView(lim, used, start, rolling.next_drop(lim, window.id if window else None, now))
    start = window_start(lim.window, lim.window_hours, now)
    return LimitView(lim, used, start, window_end(lim.window, lim.window_hours, start))


def limit_find(
    *, tenant_id: str, scope: str, scope_id: str, kind: str = "tokens", window: str = "month"
) -> TokenLimit | None:
    """The one limit of that scope, kind and window, if any."""
    return TokenLimit.objects.filter(
        tenant_id=tenant_id, scope=scope, scope_id=scope_id, kind=kind, window=window
    ).first()


@dataclass
class UsageGroupRow:
    key: dict[str, str]
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKENS, 0))
    calls: int = 0
    priced: int = 0
    cost: Decimal = Decimal(0)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.key,
            **self.sums,
            "calls": self.calls,
            "cost_usd": str(self.cost),
            "unpriced_calls": self.calls - self.priced,
            "cost": "unpriced" if self.priced == 0 and self.calls else str(self.cost),
        }


def usage_report(
    *, tenant_id: str | None, group_by: list[str], since: datetime, until: datetime
) -> list[UsageGroupRow]:
    """The ledger in [since, until) summed per group; `agent` resolves each run's agent name
    (a gateway call's agent is "")."""
    entries: QuerySet[UsageEntry] = UsageEntry.objects.filter(created_at__gte=since, created_at__lt=until)
    if tenant_id is not None:
        entries = entries.filter(tenant_id=tenant_id)
    if "day" in group_by:
        entries = entries.annotate(day=TruncDate("created_at"))
    columns = [_COLUMN[g] for g in group_by if g != "agent"] + (["run_id"] if "agent" in group_by else [])
    rows = list(entries.values(*columns).annotate(**_SUMS).order_by(*columns))
    agents = (
        run_agent_names(run_ids=sorted({r["run_id"] for r in rows if r.get("run_id")})) if "agent" in group_by else {}
    )
    out: dict[tuple[str, ...], UsageGroupRow] = {}
    for r in rows:
        key = {g: _key_value(g, r, agents) for g in group_by}
        group = out.setdefault(tuple(key.values()), UsageGroupRow(key=key))
        for t in TOKENS:
            group.sums[t] += int(r[t] or 0)
        group.calls += int(r["calls"])
        group.priced += int(r["priced"])
        group.cost += Decimal(str(r["cost"] or 0))
    return [out[k] for k in sorted(out)]


def _key_value(group: str, row: dict[str, Any], agents: dict[str, str]) -> str:
    if group == "agent":
        return agents.get(str(row["run_id"] or ""), "")
    value = row[_COLUMN[group]]
    return value.isoformat() if group == "day" else str(value)


def usage_totals(rows: list[UsageGroupRow]) -> dict[str, Any]:
    total = UsageGroupRow(key={})
    for r in rows:
        for t in TOKENS:
            total.sums[t] += r.sums[t]
        total.calls, total.priced, total.cost = total.calls + r.calls, total.priced + r.priced, total.cost + r.cost
    return total.as_dict()


def usage_groups(group_by: list[str], allowed: tuple[str, ...] = GROUPS) -> list[str]:
    """`group_by` checked against `allowed`: 400 `invalid_group_by` naming the first stranger."""
    if bad := [g for g in group_by if g not in allowed]:
        raise InvalidLimit(f"group_by must name of: {', '.join(allowed)} (got {bad[0]!r})", code="invalid_group_by")
    return group_by


def usage_range(since: str | None, until: str | None) -> tuple[datetime, datetime]:
    """A report's [from, to): ISO 8601 instants (a naive one is UTC), from defaulting to the
    start of this calendar month and to to now; 400 `invalid_time` for anything else."""
    now = timezone.now()
    return (
        _instant(since, now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)),
        _instant(until, now),
    )


def _instant(text: str | None, default: datetime) -> datetime:
    if not text:
        return default
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidLimit(f"invalid time {text[:40]!r} (want ISO 8601)", code="invalid_time") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)
