"""Reads of the usage ledger (`UsageEntry`) for the operator console. The
ledger has one row per provider call; these sum it. Every read names its
window or its runs: the ledger grows without bound."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate

from apps.gateway.models import UsageEntry


@dataclass(frozen=True)
class UsageTotals:
    """What a run (or a day of a tenant or model) spent. `cost_usd` sums the
    priced calls only; `unpriced_calls` counts those with no known price."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    calls: int = 0
    unpriced_calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class UsageGroup(enum.StrEnum):
    TENANT = "tenant"
    MODEL = "model"


@dataclass(frozen=True)
class UsageDay:
    day: date
    key: str  # the tenant id, or "provider/model"
    totals: UsageTotals


def _totals(row: Mapping[str, Any]) -> UsageTotals:
    calls = int(row["calls"] or 0)
    priced = int(row["priced"] or 0)
    return UsageTotals(
        input_tokens=int(row["input"] or 0),
        output_tokens=int(row["output"] or 0),
        cost_usd=Decimal(str(row["cost"] or 0)),
        calls=calls,
        unpriced_calls=calls - priced,
    )


_SUMS = {
    "input": Sum("input_tokens"),
    "output": Sum("output_tokens"),
    "cost": Sum("cost_usd"),
    "calls": Count("id"),
    "priced": Count("cost_usd"),
}


def usage_totals_by_run(*, run_ids: list[str]) -> dict[str, UsageTotals]:
    """{run_id: totals} for the runs of `run_ids` with ledger rows (one query, index usage_run)."""
    if not run_ids:
        return {}
    rows = UsageEntry.objects.filter(run_id__in=run_ids).values("run_id").annotate(**_SUMS).order_by()
    return {str(row["run_id"]): _totals(row) for row in rows}


def usage_by_step(*, run_id: str) -> dict[int, UsageTotals]:
    """{step: totals} of one run's provider calls (the console's usage and cost per turn)."""
    rows = UsageEntry.objects.filter(run_id=run_id).values("step").annotate(**_SUMS).order_by("step")
    return {int(row["step"] or 0): _totals(row) for row in rows}


def usage_per_day(*, since: datetime, until: datetime, by: UsageGroup) -> list[UsageDay]:
    """The ledger in [since, until) summed per UTC day and per tenant (or per
    provider/model), oldest day first; runs and gateway calls alike."""
    keys = ("tenant_id",) if by is UsageGroup.TENANT else ("provider", "model")
    rows = (
        UsageEntry.objects.filter(created_at__gte=since, created_at__lt=until)
        .annotate(day=TruncDate("created_at"))
        .values("day", *keys)
        .annotate(**_SUMS)
        .order_by("day", *keys)
    )
    return [UsageDay(day=row["day"], key=_key(row, by), totals=_totals(row)) for row in rows]


def _key(row: Mapping[str, Any], by: UsageGroup) -> str:
    if by is UsageGroup.TENANT:
        return str(row["tenant_id"])
    return f"{row['provider']}/{row['model']}"
