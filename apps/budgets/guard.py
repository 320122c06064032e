"""The guard apps.budgets installs in apps.core.spend (apps.budgets.apps), and
the once-per-run `limit` notices."""

from __future__ import annotations

from typing import Any

from django.db import connection

from apps.budgets import enforce
from apps.budgets.models import LimitNotice
from apps.core.spend import Crossing, Spender, Verdict


def notices(*, run_id: str, crossings: list[Crossing]) -> list[Crossing]:
    """The crossings this run has not had a `limit` event for yet (one per limit and severity, ever),
    marked as had in the same statement: two workers never both emit one."""
    if not crossings:
        return []
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {LimitNotice._meta.db_table} (run_id, limit_id, severity) "
            "SELECT %s, x.l, x.s FROM unnest(%s::bigint[], %s::text[]) AS x(l, s) "
            "ON CONFLICT DO NOTHING RETURNING limit_id, severity",
            [run_id, [c.limit_id for c in crossings], [c.severity for c in crossings]],
        )
        fresh = {(int(r[0]), str(r[1])) for r in cur.fetchall()}
    return [c for c in crossings if (c.limit_id, c.severity) in fresh]


class PostgresGuard:
    def admit(self, spender: Spender) -> Verdict:
        return enforce.admit(spender)

    def hold(self, *, key: str, step: int | None, spender: Spender) -> Verdict:
        return enforce.hold(key=key, step=step, spender=spender)

    def settle_run(self, *, run_id: str) -> None:
        enforce.settle_run(run_id=run_id)

    def settle_call(self, *, key: str, usage: dict[str, Any], cost_usd: str | None) -> None:
        enforce.settle_call(key=key, usage=usage, cost_usd=cost_usd)

    def notices(self, *, run_id: str, crossings: list[Crossing]) -> list[Crossing]:
        return notices(run_id=run_id, crossings=crossings)


GUARD = PostgresGuard()
