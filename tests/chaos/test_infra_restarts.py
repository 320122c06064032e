"""Infrastructure restarts (issue 25): the embedded Redis restarted with its data lost, and the
embedded Postgres restarted, each while runs are mid-flight: tool-calling runs with model latency,
parents parked on a child, channel waiters, interactive runs, Interruption asks, and an SSE client
following a run. Then every parked run is answered through the API and the engine's contract is
checked through SQL (tests/chaos/infra_workload.py): every run ended as its kind should, event seqs
and transcript idxs consecutive, one tool-call record per call and none failed, each side effect
exactly once, no lease held, every child reported, the SSE client saw every event once and its
stream ended.

The session's Postgres and Redis are shared by every test of the xdist process, so this module
restarts servers of its own: one `InfraStack` (tests/chaos/infra.py) per module, under its own data
dir, with its own workers, beat and web process. `make bench-infra` is the larger run with figures.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery, current_app

from tests.chaos import infra_workload as wl
from tests.chaos.infra import InfraStack, infra_stack
from workers.queues import RUNS

# A grace far longer than the bound below: a run whose lost doorbell waited for it fails the test.
GRACE_S = 90
RECOVERY_BOUND_S = 45
QUEUED = 6  # runs whose doorbells wait in the broker's list when Redis loses its data


@pytest.fixture(scope="module")
def infra() -> Iterator[InfraStack]:
    root = Path(os.environ["LOOMCYCLE_DATA_DIR"])
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="infra-", dir=root / "tmp"))  # not pytest's tmp tree: server_tmp says why
    grace = {"LOOMCYCLE_REQUEUE_GRACE_SECONDS": str(GRACE_S)}
    template = root / "infra-template"  # a migrated cluster kept across sessions: no migrate from empty
    try:
        with infra_stack(data, workers=2, concurrency=8, extra_env=grace, template_root=template) as stack:
            yield stack
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def http(infra: InfraStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=infra.base_url, timeout=30) as client:
        yield client


def _consumers(stack: InfraStack, action: str) -> Any:
    """`add_consumer`/`cancel_consumer` of the runs queue on every worker of the stack, over a
    new broker connection (kombu's pool would lend one that died with a restarted server)."""
    # Not the current app: later tests of this process use `current_app`, whose broker is the session's.
    app = Celery("infra-control", broker=stack.env["REDIS_URL"], set_as_current=False)
    with app.connection_for_write() as conn:
        return getattr(app.control, action)(RUNS, reply=True, timeout=5, limit=len(stack.pool.pids()), connection=conn)


def _in_flight(stack: InfraStack, w: wl.Workload) -> list[str]:
    rows = stack.sql("SELECT id FROM runs_run WHERE id = ANY(%s) AND status IN ('queued', 'running')", (w.tool_runs,))
    return [r for (r,) in rows]


def test_a_redis_restart_that_loses_its_data_loses_no_run_and_stops_no_worker(
    infra: InfraStack, http: httpx.Client
) -> None:
    w = wl.workload_start(http, infra, tag="redis", tool_runs=4, steps=3, each=1)
    wl.wait_parked(infra, w)
    # Inside a long model call when Redis dies: its worker holds a delivered, unacked doorbell,
    # which Celery's reconnect tries to restore (and, before the fix, stopped the worker doing so).
    slow = wl._post(http, "chaos", 'MOCK_SCRIPT: [{"sleep_ms": 15000, "text": "slow"}]')
    wl.wait_until(lambda: infra.sql("SELECT lease_owner FROM runs_run WHERE id = %s", (slow,))[0][0], 60, "slow claim")
    in_flight = [slow, *_in_flight(infra, w)]
    _consumers(infra, "cancel_consumer")
    try:
        queued = [wl._post(http, "echo", "hello") for _ in range(QUEUED)]  # their doorbells wait in Redis
        pids = infra.pool.pids()
        infra.restart_redis(lose_data=True)
        restarted = infra.sql("SELECT now()")[0][0]
    finally:
        wl.wait_until(lambda: _consumers(infra, "add_consumer"), 60, "workers consuming again")
    assert infra.pool.pids() == pids  # no worker stopped on the lost broker
    delays = wl.next_event_delays(infra, [*queued, *in_flight], restarted, RECOVERY_BOUND_S)
    wl.unpark(http, infra, w)
    wl.finish(http, infra, w)
    done = [*queued, slow]
    wl.wait_until(lambda: set(wl.statuses(infra, done).values()) <= set(wl.TERMINAL), 60, "queued and slow runs ended")
    assert set(wl.statuses(infra, done).values()) == {"completed"}
    assert wl.contract_violations(infra, w, "redis") == []
    assert max(delays) < RECOVERY_BOUND_S < GRACE_S


def test_a_postgres_restart_loses_no_run(infra: InfraStack, http: httpx.Client) -> None:
    w = wl.workload_start(http, infra, tag="pg", tool_runs=4, steps=3, each=1)
    wl.wait_parked(infra, w)
    in_flight = _in_flight(infra, w)
    pids = infra.pool.pids()
    infra.restart_postgres(down_s=2.0)
    restarted = infra.sql("SELECT now()")[0][0]
    wl.next_event_delays(infra, in_flight, restarted, RECOVERY_BOUND_S)
    wl.unpark(http, infra, w)
    wl.finish(http, infra, w)
    assert infra.pool.pids() == pids
    assert wl.contract_violations(infra, w, "pg") == []


def test_the_stacks_control_app_leaves_the_current_app_alone(infra: InfraStack) -> None:
    before = current_app._get_current_object()
    _consumers(infra, "add_consumer")  # a no-op on workers that consume already
    assert current_app._get_current_object() is before and current_app.main != "infra-control"
