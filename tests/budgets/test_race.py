"""Two worker processes race for the last tokens of one budget (issue 37). The bound,
and why it holds (apps.budgets.enforce): a provider call starts only after reserving
one token with `UPDATE ... WHERE used + held < hard`, and its spend joins `used` when
it settles (at the run's next gate, park or end). So every call that starts saw the
budget unspent, and the budget ends over its hard limit by at most one call per run
in flight; and when R tokens remain, at most R calls are let through together, never
two on the last one."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db.models import Max, Sum

from apps.budgets import services
from apps.budgets.models import LimitHold, LimitWindow, TokenLimit
from apps.gateway.models import UsageEntry
from apps.runs.models import RunStatus
from tests import procs
from tests.conftest import wait_status
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents")

RUNS, HARD = 16, 400


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


@pytest.mark.parametrize(("window", "hours"), [("month", 0), ("hours", 3)])  # a calendar and a rolling window
def test_concurrent_runs_on_two_workers_overshoot_by_at_most_one_call_per_run(
    workers: procs.WorkerPool, window: str, hours: int
) -> None:
    spec = services.LimitSpec(
        tenant_id="", scope="user", scope_id="u-race", window=window, window_hours=hours, hard_limit=Decimal(HARD)
    )
    services.limit_put(spec=spec, updated_by="test")
    # Every run is admitted before any spends (on a slow host the first runs could otherwise use
    # the budget up while the last ones are still being created): the workers start after.
    workers.stop()
    runs = [start("stepper", f"race {i}", user_id="u-race") for i in range(RUNS)]
    workers.ensure()
    assert len(workers.procs) >= 2  # two worker processes take the runs' iterations
    ended = [wait_status(r.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60) for r in runs]
    assert {r.status for r in ended} == {RunStatus.COMPLETED}
    assert any(r.stop_reason == "token_limit_exceeded" for r in ended)  # the budget did run out
    calls = UsageEntry.objects.filter(user_id="u-race")
    sums = calls.aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"), biggest=Max("input_tokens"))
    total = int(sums["i"]) + int(sums["o"])
    biggest_call = int(sums["biggest"]) + int(calls.aggregate(o=Max("output_tokens"))["o"])
    assert total - HARD <= RUNS * biggest_call  # the stated bound: one call per run in flight
    row = LimitWindow.objects.get(limit__scope_id="u-race")
    assert row.used == total and row.held == 0 and not LimitHold.objects.exists()  # exact accounting
    stopped = [r for r in ended if r.stop_reason == "token_limit_exceeded"]
    assert all(calls.filter(run_id=r.id).count() < 5 for r in stopped)  # they stopped before their last call
