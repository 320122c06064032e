"""The usage page's numbers: the ledger per UTC day over a window, by tenant
and by model, as chart series and table rows (apps.gateway.selectors reads,
apps.gateway.chart draws)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.utils import timezone

from apps.gateway.chart import Series, stacked_bars
from apps.gateway.selectors import UsageDay, UsageGroup, UsageTotals, usage_per_day

MAX_DAYS = 366


@dataclass(frozen=True)
class UsageRow:
    day: date
    key: str
    totals: UsageTotals


@dataclass(frozen=True)
class UsageSection:
    by: UsageGroup
    tokens_svg: str
    cost_svg: str
    rows: list[UsageRow]  # day, then key
    total: UsageTotals


@dataclass(frozen=True)
class UsageReport:
    days: list[date]
    sections: list[UsageSection]


def usage_report(*, days: int, today: date | None = None) -> UsageReport:
    """The last `days` UTC days up to `today` (default: today), by tenant then by model."""
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be between 1 and {MAX_DAYS}")
    last = today or timezone.now().date()
    window = [last - timedelta(days=n) for n in range(days - 1, -1, -1)]
    since = datetime.combine(window[0], time.min, tzinfo=UTC)
    until = datetime.combine(last + timedelta(days=1), time.min, tzinfo=UTC)
    sections = [_section(usage_per_day(since=since, until=until, by=by), window, by) for by in UsageGroup]
    return UsageReport(days=window, sections=sections)


def _section(found: list[UsageDay], window: list[date], by: UsageGroup) -> UsageSection:
    keys = sorted({d.key for d in found})
    cells = {(d.day, d.key): d.totals for d in found}
    tokens = [Series(k, tuple(float(cells.get((day, k), UsageTotals()).tokens) for day in window)) for k in keys]
    cost = [Series(k, tuple(float(cells.get((day, k), UsageTotals()).cost_usd) for day in window)) for k in keys]
    return UsageSection(
        by=by,
        tokens_svg=stacked_bars(title=f"tokens per day by {by.value}", days=window, series=tokens, unit="tokens"),
        cost_svg=stacked_bars(title=f"cost (USD) per day by {by.value}", days=window, series=cost, unit="$"),
        rows=[UsageRow(d.day, d.key, d.totals) for d in found],
        total=_sum([d.totals for d in found]),
    )


def _sum(totals: list[UsageTotals]) -> UsageTotals:
    return UsageTotals(
        input_tokens=sum(t.input_tokens for t in totals),
        output_tokens=sum(t.output_tokens for t in totals),
        cost_usd=sum((t.cost_usd for t in totals), Decimal("0")),
        calls=sum(t.calls for t in totals),
        unpriced_calls=sum(t.unpriced_calls for t in totals),
    )
