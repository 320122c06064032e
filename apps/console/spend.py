"""The spend page's figures, from what the usage and limits selectors answer (the rows of
GET /v1/_usage and GET /v1/_limits): one chart series per agent (tokens) or per model (cost)
with one point per day, and each budget's remaining fraction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from apps.budgets.selectors import TOKENS, LimitView

NO_AGENT = "(no agent)"  # a gateway call's usage has no run, so no agent


def tokens_of(group: dict[str, Any]) -> float:
    """Input, output, cache write and cache read: what a `tokens` budget counts."""
    return float(sum(int(group[t]) for t in TOKENS))


def cost_of(group: dict[str, Any]) -> float:
    return float(Decimal(str(group["cost_usd"])))


def per_day(groups: list[dict[str, Any]], by: str, measure: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
    """`groups` (each keyed by `day` and `by`) as Chart.js data: `labels` the days, one
    dataset per `by` value with one number per day (0 where it spent nothing)."""
    days = sorted({g["day"] for g in groups})
    names = sorted({g[by] for g in groups})
    cells: dict[tuple[str, str], float] = {}
    for g in groups:
        cells[(g[by], g["day"])] = cells.get((g[by], g["day"]), 0.0) + measure(g)
    datasets = [{"label": n or NO_AGENT, "data": [cells.get((n, d), 0.0) for d in days]} for n in names]
    return {"labels": days, "datasets": datasets}


@dataclass(frozen=True)
class Budget:
    view: LimitView
    limit: Decimal | None  # the hard limit, else the soft one
    remaining: float | None  # of `limit`, 0..1; None without a limit

    @property
    def percent(self) -> str:
        return "" if self.remaining is None else f"{self.remaining * 100:.1f}%"

    @property
    def figures(self) -> tuple[str, str, str]:
        """Used, soft and hard as GET /v1/_limits writes them ("" for no limit)."""
        row = self.view.row
        return number(self.view.used), number(row.soft_limit), number(row.hard_limit)


def number(value: Decimal | None) -> str:
    """A whole number without its decimals, else the plain decimal (never exponent notation)."""
    if value is None:
        return ""
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def budget_of(view: LimitView) -> Budget:
    row = view.row
    limit = row.hard_limit if row.hard_limit is not None else row.soft_limit
    if not limit:
        return Budget(view, limit, None)
    return Budget(view, limit, max(0.0, 1.0 - float(view.used / limit)))
