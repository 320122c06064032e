"""Rolling N-hour windows (issue 37, apps.budgets.rolling): a spend counts for exactly N hours
after it settles, cluster-wide and exactly, through the same reservation as calendar windows.
Driven by a test clock (the `now` every gate, settle and admission takes), never a sleep."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.budgets import enforce, rolling, selectors, services
from apps.budgets.models import LimitHold, LimitSpend, LimitWindow, TokenLimit
from apps.core.spend import Spender

pytestmark = pytest.mark.django_db

SPENDER = Spender("", "u-roll")
US = timedelta(microseconds=1)


@pytest.fixture(autouse=True)
def _no_limits() -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def rolling_limit(hours: int = 2, hard: int = 100) -> TokenLimit:
    spec = services.LimitSpec(
        tenant_id="", scope="user", scope_id="u-roll", window="hours", window_hours=hours, hard_limit=Decimal(hard)
    )
    return services.limit_put(spec=spec, updated_by="test")


def spend(key: str, tokens: int, at: datetime) -> None:
    """One gateway call at `at`: reserve, then settle what it spent."""
    assert enforce.hold(key=key, step=None, spender=SPENDER, now=at).allowed
    enforce.settle_call(key=key, usage={"input_tokens": tokens}, cost_usd=None, now=at)


def used_at(now: datetime) -> Decimal:
    [view] = selectors.limits_list(tenant_id="", now=now)
    return view.used


def test_a_spend_stops_counting_exactly_n_hours_after_it_settled() -> None:
    rolling_limit(hours=2, hard=100)
    t0 = timezone.now()
    t1 = t0 + timedelta(minutes=30)
    spend("gw:a", 60, t0)
    spend("gw:b", 50, t1)  # 110 in the last 2 hours: over
    refused = enforce.admit(SPENDER, t1)
    assert refused.hard is not None and refused.hard.used == "110"
    assert refused.hard.resume_at == t0 + timedelta(hours=2)  # when the 60 ages out, 50 < 100 is left
    assert not enforce.hold(key="gw:c", step=None, spender=SPENDER, now=t0 + timedelta(hours=2) - US).allowed
    assert enforce.admit(SPENDER, t0 + timedelta(hours=2) - US).hard is not None  # a microsecond before: both count
    assert enforce.admit(SPENDER, t0 + timedelta(hours=2)).allowed  # at the instant: only the 50 is left
    assert used_at(t0 + timedelta(hours=2)) == 50
    assert used_at(t1 + timedelta(hours=2) - US) == 50 and used_at(t1 + timedelta(hours=2)) == 0
    assert enforce.hold(key="gw:d", step=None, spender=SPENDER, now=t0 + timedelta(hours=2)).allowed
    window = LimitWindow.objects.get(limit__scope_id="u-roll")
    assert (window.used, window.held) == (Decimal(110), Decimal(1))  # everything ever settled, and gw:d's reservation


def test_the_reservation_counts_holds_and_only_the_last_n_hours() -> None:
    """The conditional UPDATE itself: with 99 of 100 spent in the window, one call may hold the
    last unit and a second may not, until the old spend ages out."""
    rolling_limit(hours=1, hard=100)
    t0 = timezone.now()
    spend("gw:old", 99, t0)
    later = t0 + timedelta(minutes=59)
    assert enforce.hold(key="gw:x", step=None, spender=SPENDER, now=later).allowed  # 99 + 0 held < 100
    assert not enforce.hold(key="gw:y", step=None, spender=SPENDER, now=later).allowed  # 99 + 1 held
    assert enforce.hold(key="gw:y", step=None, spender=SPENDER, now=t0 + timedelta(hours=1)).allowed  # 0 + 1
    assert LimitHold.objects.filter(key__in=["gw:x", "gw:y"]).count() == 2


def test_the_spend_rows_no_cutoff_needs_are_pruned() -> None:
    limit = rolling_limit(hours=1, hard=10**6)
    t0 = timezone.now()
    for i in range(5):
        spend(f"gw:p{i}", 10, t0 + timedelta(minutes=20 * i))  # at 0, 20, 40, 60, 80 minutes
    assert used_at(t0 + timedelta(minutes=100)) == 20  # the spends at 60 and 80 minutes
    enforce.holds_sweep(older_than=timedelta(hours=1), now=t0 + timedelta(minutes=100))
    kept = sorted(LimitSpend.objects.filter(window__limit=limit).values_list("total", flat=True))
    assert kept == [30, 40, 50]  # the newest row at or before the cutoff (40 minutes), and the ones after it
    assert used_at(t0 + timedelta(minutes=100)) == 20 and used_at(t0 + timedelta(minutes=130)) == 10


def test_the_aged_out_lookup_is_one_probe_of_the_index() -> None:
    """EXPLAIN of the reservation's statement on a window with 20,000 spend rows: the aged-out
    total is an index scan of limit_spend_at under a Limit, never a scan of the table."""
    rolling_limit(hours=1, hard=10**9)
    spend("gw:seed", 1, timezone.now())
    window = LimitWindow.objects.get(limit__scope_id="u-roll")
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {LimitSpend._meta.db_table} (window_id, at, total) "
            "SELECT %s, now() - make_interval(secs => g), 20000 - g FROM generate_series(1, 20000) g",
            [window.id],
        )
        cur.execute(f"ANALYZE {LimitSpend._meta.db_table}")
        now = timezone.now()
        params: dict[str, Any] = {"add": 5, "rel": 1, "unit": 1, "now": now, "w": window.id, "hard": 10**9}
        params["c"] = now - timedelta(hours=1)
        cur.execute("EXPLAIN " + rolling.MOVE_SQL, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "Scan Backward using limit_spend_at" in plan, plan  # an index (only) scan, newest first, under a Limit
    assert f"Seq Scan on {LimitSpend._meta.db_table}" not in plan, plan
