"""The small chaos run (issue 25): a mixed workload through the public API
while worker processes are killed with SIGKILL, one is stalled past its lease
with SIGSTOP and then let go (its late commit must be refused by the fence),
and duplicate doorbells are pushed straight into the broker. Then the
engine's contract is checked through SQL (tests/chaos/harness.py, shared with
the large run, `make chaos`).

Faults are paced by the workload's own progress (a number of committed
events since the last fault), not by a clock. Bounded: the whole run must end
within DEADLINE_S.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest
from django.conf import settings

from apps.runs.models import Run, RunEvent, RunStatus
from tests.chaos import harness
from tests.chaos.harness import Expected, post_run
from tests.conftest import wait_for
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

TOOL_RUNS, STEPS, SPAWNS, INTERACTIVE = 24, 4, 4, 4
KILLS = 3
DEADLINE_S = 150.0


def _events() -> int:
    return RunEvent.objects.count()


def _after_progress(n: int) -> None:
    """Pace the next fault: wait until `n` more events committed (or nothing is in flight)."""
    target = _events() + n
    wait_for(lambda: _events() >= target or not harness.in_flight(), timeout=60)


def _start(http: httpx.Client) -> Expected:
    expect = Expected(steps=STEPS)
    for i in range(TOOL_RUNS):
        expect.tool_runs[post_run(http, {"agent": "chaos", "prompt": harness.tool_script(i, STEPS, 400)})] = i
    expect.spawns = [post_run(http, {"agent": "spawner", "prompt": "spawn"}) for _ in range(SPAWNS)]
    chat = {"agent": "chaos", "prompt": harness.chat_script(), "interactive": True}
    expect.chats = [post_run(http, chat) for _ in range(INTERACTIVE)]
    return expect


def _answer_then_end(http: httpx.Client, chats: list[str]) -> None:
    """Answer each interactive run once it parked, then cancel it once it parked again."""
    for run_id in chats:
        wait_for(lambda r=run_id: Run.objects.get(id=r).status == RunStatus.AWAITING_INPUT, timeout=DEADLINE_S)
        assert http.post(f"/v1/runs/{run_id}/input", json={"text": "go on"}).status_code in (200, 202)
    for run_id in chats:
        wait_for(
            lambda r=run_id: RunEvent.objects.filter(run_id=r, type="awaiting_input").count() >= 2,
            timeout=DEADLINE_S,
        )
        agent_id = Run.objects.get(id=run_id).agent_id
        assert http.post(f"/v1/agents/{agent_id}/cancel", json={}).status_code == 200


def test_a_mixed_workload_survives_kills_a_stall_and_duplicate_doorbells(http: httpx.Client, stack: WorkerPool) -> None:
    rng = random.Random(25)
    t0 = time.monotonic()
    wait_for(lambda: all(harness.worker_id(pid) for pid in stack.pids()), timeout=60)
    expect = _start(http)
    faults: dict[str, int] = {"kill": 0, "stall": 0, "duplicate_doorbells": 0}

    recoveries: list[float] = []
    for _ in range(KILLS):  # SIGKILL the worker holding the most leases, then top the pool up
        _after_progress(20)
        recoveries += harness.recovery(harness.kill_worker(stack), timeout=60)
        faults["kill"] += 1

    _after_progress(10)
    harness.stall_worker(stack, lease_timeout=30)
    faults["stall"] += 1
    faults["duplicate_doorbells"] = len(harness.duplicate_doorbells(rng, 8).affected)

    _answer_then_end(http, expect.chats)
    remaining = DEADLINE_S - (time.monotonic() - t0)
    everything = expect.everything()
    wait_for(lambda: harness.terminal_count(everything) == len(everything), timeout=max(remaining, 1))

    assert harness.violations(expect) == []
    assert faults["kill"] == KILLS and faults["stall"] == 1
    assert settings.LOOMCYCLE.lease_seconds < 10  # the stall outlived a lease of the test settings
    assert recoveries, "no kill hit a worker holding a lease"
    recoveries.sort()
    print(
        f"chaos: {len(everything)} runs, faults {faults}, violations 0, recovery after a kill "
        f"p50 {recoveries[len(recoveries) // 2]:.2f} s, p100 {recoveries[-1]:.2f} s over {len(recoveries)} runs"
    )
