"""What the spend gate costs an iteration (issue 37, docs/performance.md "Budgets"): the claim
reads the limits' generation, so a gate whose limits did not change makes no query when none
is in scope, and skips the limits read when some are; a limit written meanwhile moves the
generation and the next claim's gate reads it. Counted with Django's CaptureQueriesContext on
the engine's own calls (a real claim, the real gate), here in the test process."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.budgets import hot, services
from apps.budgets.models import LimitHold, LimitWindow, TokenLimit
from apps.gateway.models import UsageEntry, UsageSource
from apps.runs import store
from apps.runs.engine import budget
from apps.runs.engine.write import Next, StepWrite
from apps.runs.models import Run, RunStatus
from apps.runs.store import ClaimedRun
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

BIG = Decimal(10**12)


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    Run.objects.filter(lease_owner="test-gate").update(status=RunStatus.COMPLETED, lease_until=None)
    TokenLimit.objects.all().delete()


def put(**kw: object) -> None:
    services.limit_put(spec=services.LimitSpec(**{"tenant_id": "", **kw}), updated_by="test")  # type: ignore[arg-type]


def claimed(user: str) -> ClaimedRun:
    run = start("echo", user_id=user)
    c = store.claim(run_id=run.id, step=run.step, owner="test-gate", lease_seconds=60)
    assert c is not None
    return c


def gate_queries(run: ClaimedRun) -> tuple[int, StepWrite]:
    write = StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE)
    with CaptureQueriesContext(connection) as queries:
        assert budget.gate(run, write) is None
    return len(queries), write


def test_with_no_limit_in_scope_the_gate_makes_no_query() -> None:
    run = claimed("u-none")
    gate_queries(run)  # this process's first look at this generation reads the limits (none)
    assert gate_queries(run)[0] == 0
    put(scope="user", scope_id="u-other", hard_limit=BIG)  # a limit, but another user's
    other = claimed("u-none")
    assert other.limits_generation != run.limits_generation  # the write moved the generation
    assert gate_queries(other)[0] == 1  # read once: the new limits
    assert gate_queries(other)[0] == 0


def test_a_limit_written_between_iterations_applies_from_the_next_claim() -> None:
    before = claimed("u-late")
    gate_queries(before)
    put(scope="user", scope_id="u-late", hard_limit=Decimal(0))
    Run.objects.filter(id=before.id).update(lease_until=None)  # the iteration ended: claimable again
    after = store.claim(run_id=before.id, step=before.step, owner="test-gate", lease_seconds=60)
    assert after is not None and after.limits_generation != before.limits_generation
    stopped = budget.gate(after, StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE))
    assert stopped is not None and stopped.stop_reason == "token_limit_exceeded"


def test_with_three_limits_in_scope_the_gate_is_one_transaction_of_five_statements() -> None:
    """An operator soft limit, a tenant hard limit and an agent cost limit (bench/budgets.py's
    three), the previous call's ledger row to settle: BEGIN; the holds' delete with their
    ledger sums; the windows' read with the new holds' insert; one UPDATE per window; COMMIT.
    (Before: a limits read, then the delete, the ledger read, the windows read and the holds'
    insert as statements of their own: 10.)"""
    put(scope="operator", soft_limit=BIG)
    put(scope="tenant", hard_limit=BIG)
    put(scope="agent", scope_id="echo", kind="cost_usd", hard_limit=BIG)
    run = claimed("u-three")
    assert gate_queries(run)[1].budget_held
    UsageEntry.objects.create(
        created_at=timezone.now(), run_id=run.id, step=run.step, source=UsageSource.RUN, provider="mock", model="m",
        input_tokens=7, output_tokens=3,
    )  # fmt: skip
    assert gate_queries(run)[0] == 7
    used = dict(LimitWindow.objects.values_list("limit__scope", "used"))
    assert used == {"operator": 10, "tenant": 10, "agent": 0}  # settled (the mock is unpriced: no cost)
    assert LimitHold.objects.filter(key=f"run:{run.id}").count() == 3


def test_a_runs_gate_commits_without_waiting_for_the_wal_flush() -> None:
    """The gate's transaction commits as the claim's does (synchronous_commit off for it alone,
    apps.budgets.hot.take_holds); a gateway call's hold and every settle keep the server's setting."""

    def setting_after(key: str, *, lazy: bool) -> str:
        with transaction.atomic(), connection.cursor() as cur:
            hot.take_holds(key, None, lazy=lazy)
            cur.execute("SELECT current_setting('synchronous_commit')")
            return str(cur.fetchone()[0])

    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit = on")  # (the test cluster runs with it off)
    try:
        assert setting_after("gw:x", lazy=False) == "on" and setting_after("run:x", lazy=True) == "off"
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('synchronous_commit')")
            assert cur.fetchone()[0] == "on"  # for that transaction only
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET synchronous_commit")
    put(scope="tenant", hard_limit=BIG)
    run = claimed("u-lazy")
    with CaptureQueriesContext(connection) as queries:
        budget.gate(run, StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE))
    [take] = [q["sql"] for q in queries.captured_queries if "synchronous_commit" in q["sql"]]
    assert "CASE WHEN true THEN 'off'" in take  # the run's gate asked for it
