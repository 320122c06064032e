"""The guard apps.budgets installs in apps.core.spend (apps.budgets.apps), and
the once-per-run `limit` notices."""

from __future__ import annotations

from typing import Any

from django.db import connection

from apps.budgets import enforce
from apps.budgets.models import LimitNotice
from apps.core.spend import Crossing, Spender, Verdict


def notices(*, run_id: str, crossings: list[Crossing]) -> list[Crossing]:
    """The crossings this run has not had a `limit` event for yet: one per (scope, severity), ever
    (SPEC 3.3; the first crossing of a scope's limits in `crossings` speaks for them), marked as
    had in the same statement: two workers never both emit one."""
    first: dict[tuple[str, str], Crossing] = {}
    for c in crossings:
        first.setdefault((c.scope, c.severity), c)
    if not first:
        return []
    picked = list(first.values())
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {LimitNotice._meta.db_table} (run_id, limit_id, scope, severity) "
            "SELECT %s, x.l, x.c, x.s FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS x(l, c, s) "
            "ON CONFLICT DO NOTHING RETURNING scope, severity",
            [run_id, [c.limit_id for c in picked], [c.scope for c in picked], [c.severity for c in picked]],
        )
        fresh = {(str(r[0]), str(r[1])) for r in cur.fetchall()}
    return [c for c in picked if (c.scope, c.severity) in fresh]


class PostgresGuard:
    def admit(self, spender: Spender) -> Verdict:
        return enforce.admit(spender)

    def hold(self, *, key: str, step: int | None, spender: Spender, generation: int | None = None) -> Verdict:
        return enforce.hold(key=key, step=step, spender=spender, generation=generation)

    def settle_run(self, *, run_id: str) -> None:
        enforce.settle_run(run_id=run_id)

    def settle_call(self, *, key: str, usage: dict[str, Any], cost_usd: str | None) -> None:
        enforce.settle_call(key=key, usage=usage, cost_usd=cost_usd)

    def notices(self, *, run_id: str, crossings: list[Crossing]) -> list[Crossing]:
        return notices(run_id=run_id, crossings=crossings)


GUARD = PostgresGuard()
