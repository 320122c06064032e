"""Leases are compared with Postgres's clock only: a sweeper or a cancelling
host whose clock runs 60 s ahead (tests/skewed_clock.py, a real separate
process) must not take a live lease."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from apps.runs.models import RunStatus
from tests.conftest import run_row, wait_for, wait_status
from tests.factories.runs import event_types, start
from tests.procs import ROOT, WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

AHEAD_S = 60


def skewed(env: dict[str, str], *args: str) -> object:
    argv = [sys.executable, "-m", "tests.skewed_clock", str(AHEAD_S), *args]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_sweeper_whose_clock_runs_ahead_requeues_no_live_lease(stack: WorkerPool, stack_env: dict[str, str]) -> None:
    run = start("very-slow")  # a 60 s provider call; the 3 s lease is kept alive by the heartbeat
    wait_for(lambda: run_row(run.id).lease_owner)
    assert skewed(stack_env, "sweep") == 0
    row = run_row(run.id)
    assert row.status == RunStatus.RUNNING and row.lease_owner and row.lease_token == 1


def test_a_cancel_from_a_host_whose_clock_runs_ahead_goes_through_the_lease_holder(
    stack: WorkerPool, stack_env: dict[str, str]
) -> None:
    run = start("very-slow")
    wait_for(lambda: run_row(run.id).lease_owner)
    out = skewed(stack_env, "cancel", run.agent_id)
    assert isinstance(out, dict) and out["cancelled"] is True
    done = wait_status(run.id, RunStatus.CANCELLED, timeout=5)
    # Finished by the worker holding the lease (its fenced commit), not in place
    # over a lease the skewed host thought expired (that bumps lease_token).
    assert done.lease_token == 1 and done.stop_reason == "cancelled by a skewed host"
    assert event_types(run.id) == ["user_input", "started", "done"]
