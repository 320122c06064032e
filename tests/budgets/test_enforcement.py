"""Budgets enforced where tokens are spent (issue 37): admission, the iteration
boundary, children, the once-per-run `limit` events, and deferral woken by a
window reset (a test clock) or a raised limit, exactly once. Real workers run
the runs; limits are written through the service the API calls."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import F, Sum
from django.utils import timezone

from apps.budgets import enforce, services
from apps.budgets.models import LimitHold, LimitSpend, LimitWindow, TokenLimit
from apps.budgets.windows import window_start
from apps.core.spend import Spender, TokenLimitExceeded
from apps.gateway.models import UsageEntry
from apps.runs import services as runs
from apps.runs.models import RunEvent, RunStatus
from apps.runs.presenters import agent_out
from tests.conftest import ALICE, wait_for, wait_status
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def put(**kw: object) -> TokenLimit:
    spec = services.LimitSpec(**{"tenant_id": "", **kw})  # type: ignore[arg-type]
    return services.limit_put(spec=spec, updated_by="test")


def limits_of(run_id: str) -> list[dict[str, object]]:
    return [e.payload["limit"] for e in RunEvent.objects.filter(run_id=run_id, type="limit").order_by("seq")]


def spent(**filters: object) -> int:
    sums = UsageEntry.objects.filter(**filters).aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
    return int(sums["i"] or 0) + int(sums["o"] or 0)


def test_a_run_over_a_hard_limit_is_refused_at_admission_with_429_token_limit_exceeded() -> None:
    put(scope="user", scope_id="u-adm", hard_limit=Decimal(0))
    with pytest.raises(TokenLimitExceeded) as refused:
        start("echo", user_id="u-adm")
    assert refused.value.status == 429 and refused.value.code == "token_limit_exceeded"
    assert refused.value.details["scope"] == "user" and refused.value.details["scope_id"] == "u-adm"
    assert refused.value.details["limit"] == 0 and refused.value.details["window"] == "month"
    assert int(refused.value.headers["Retry-After"]) >= 1  # the seconds until the month's window resets
    start("echo", user_id="someone-else")  # another user's budget is not this one


def test_a_run_crossing_a_hard_limit_stops_at_the_next_iteration_with_one_limit_event() -> None:
    put(scope="agent", scope_id="stepper", hard_limit=Decimal(1))
    run = start("stepper", user_id="u-mid")
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED and done.stop_reason == "token_limit_exceeded"
    assert UsageEntry.objects.filter(run_id=run.id).count() == 1  # the first call passed; the second never started
    [hard] = limits_of(run.id)
    assert hard["severity"] == "hard" and hard["scope"] == "agent" and hard["scope_id"] == "stepper"
    window = LimitWindow.objects.get(limit__scope_id="stepper")
    assert window.used == spent(run_id=run.id) and window.held == 0
    assert not LimitHold.objects.exists()


def test_a_soft_limit_warns_once_per_run_and_the_run_goes_on() -> None:
    put(scope="user", scope_id="u-soft", soft_limit=Decimal(1))
    run = start("stepper", user_id="u-soft")
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED and done.stop_reason != "token_limit_exceeded"
    assert [e["severity"] for e in limits_of(run.id)] == ["soft"]  # five calls over the threshold, one event
    assert UsageEntry.objects.filter(run_id=run.id).count() == 5


def test_two_limits_of_one_scope_crossing_together_make_one_limit_event_per_severity() -> None:
    """SPEC 3.3: once per (scope, severity) per run, not once per limit: the user's month and
    day token limits both pass their soft threshold at the first gate, and the day's hard one
    stops the run; the user scope has one soft and one hard event."""
    put(scope="user", scope_id="u-two", soft_limit=Decimal(1))
    put(scope="user", scope_id="u-two", window="day", soft_limit=Decimal(1), hard_limit=Decimal(40))
    run = start("stepper", user_id="u-two")
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.stop_reason == "token_limit_exceeded"
    events = limits_of(run.id)
    assert [(e["scope"], e["severity"]) for e in events] == [("user", "soft"), ("user", "hard")]
    assert UsageEntry.objects.filter(run_id=run.id).count() < 5  # the hard limit did stop it


def test_children_spend_their_roots_tenant_and_user_budget() -> None:
    put(scope="user", scope_id="u-kids", soft_limit=Decimal(10**9))
    root = start("recursor", "go", user_id="u-kids")
    wait_status(root.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=40)
    wait_for(lambda: not LimitHold.objects.exists(), timeout=10)
    children = UsageEntry.objects.filter(user_id="u-kids").exclude(run_id=root.id)
    assert children.exists()  # sub-agents made calls, under the root's user
    assert LimitWindow.objects.get(limit__scope_id="u-kids").used == spent(user_id="u-kids")


def _exhaust_yesterday(limit: TokenLimit, now: object) -> None:
    LimitWindow.objects.create(limit=limit, start=window_start("day", 0, now), used=limit.hard_limit)  # type: ignore[arg-type]


def test_a_deferred_run_resumes_exactly_once_when_its_window_rolls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test clock stands at yesterday noon: the day's budget is spent, the run parks.
    At yesterday's clock the wake finds nothing; at today's (the window rolled) it wakes the run, once."""
    today = timezone.now()
    yesterday = today.replace(hour=12, minute=0) - timedelta(days=1)
    limit = put(scope="user", scope_id="u-defer", window="day", hard_limit=Decimal(100), on_exceed="defer")
    _exhaust_yesterday(limit, yesterday)
    monkeypatch.setattr(timezone, "now", lambda: yesterday)
    run = start("echo", user_id="u-defer")
    assert run.status == RunStatus.WAITING_BUDGET
    assert services.budgets_wake(now=yesterday) == 0
    monkeypatch.undo()
    assert services.budgets_wake(now=today) == 1
    assert services.budgets_wake(now=today) == 0  # exactly once
    assert wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=20).status == RunStatus.COMPLETED


def test_a_run_deferred_by_a_rolling_window_resumes_once_the_spend_ages_out() -> None:
    """Rows backdated in SQL stand in for the clock (the workers read their own): 1,000 tokens
    settled an hour ago fill a 2-hour window; once they are stamped 2 hours back, the wake resumes the run."""
    put(scope="user", scope_id="u-roll", window="hours", window_hours=2, hard_limit=Decimal(1000), on_exceed="defer")
    spender, an_hour_ago = Spender("", "u-roll"), timezone.now() - timedelta(hours=1)
    assert enforce.hold(key="gw:filler", step=None, spender=spender, now=an_hour_ago).allowed
    enforce.settle_call(key="gw:filler", usage={"input_tokens": 1000}, cost_usd=None, now=an_hour_ago)
    run = start("echo", user_id="u-roll")
    assert run.status == RunStatus.WAITING_BUDGET
    assert services.budgets_wake() == 0
    LimitSpend.objects.filter(window__limit__scope_id="u-roll").update(at=F("at") - timedelta(hours=1, seconds=1))
    assert services.budgets_wake() == 1 and services.budgets_wake() == 0  # exactly once
    assert wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=20).status == RunStatus.COMPLETED


def test_a_deferred_run_can_be_cancelled_and_is_not_woken_after() -> None:
    put(scope="user", scope_id="u-cancel", hard_limit=Decimal(0), on_exceed="defer")
    run = start("echo", user_id="u-cancel")
    assert run.status == RunStatus.WAITING_BUDGET
    runs.run_cancel(principal=ALICE, run_id=run.id)
    assert wait_status(run.id, RunStatus.CANCELLED, timeout=10).status == RunStatus.CANCELLED
    TokenLimit.objects.all().delete()
    assert services.budgets_wake() == 0


def test_raising_the_limit_wakes_the_deferred_runs() -> None:
    put(scope="user", scope_id="u-raise", hard_limit=Decimal(0), on_exceed="defer")
    parked = [start("echo", user_id="u-raise") for _ in range(3)]
    assert {r.status for r in parked} == {RunStatus.WAITING_BUDGET}
    put(scope="user", scope_id="u-raise", hard_limit=Decimal(10**6), on_exceed="defer")  # wakes on commit
    for r in parked:
        assert wait_status(r.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=20).status == RunStatus.COMPLETED


def test_a_run_crossing_a_deferring_limit_parks_mid_run_and_resumes_once_raised() -> None:
    put(scope="agent", scope_id="stepper", hard_limit=Decimal(1), on_exceed="defer")
    run = start("stepper", user_id="u-park")
    parked = wait_status(run.id, RunStatus.WAITING_BUDGET, timeout=30)
    assert UsageEntry.objects.filter(run_id=run.id).count() == 1  # parked at the boundary after its first call
    [hard] = limits_of(run.id)
    assert hard["severity"] == "hard"
    [waiting] = [e.payload for e in RunEvent.objects.filter(run_id=run.id, type="waiting_budget")]
    shown = agent_out(parked)
    assert shown["awaited_state"] == "budget" and shown["awaited_on"] and waiting["resume_at"]
    put(scope="agent", scope_id="stepper", hard_limit=Decimal(10**6), on_exceed="defer")  # wakes it on commit
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=30)
    assert done.status == RunStatus.COMPLETED and done.stop_reason != "token_limit_exceeded"
    assert UsageEntry.objects.filter(run_id=run.id).count() == 5 and len(limits_of(run.id)) == 1
