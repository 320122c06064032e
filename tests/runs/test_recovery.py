"""Retries, heartbeats and lost doorbells, against real worker and beat processes."""

from __future__ import annotations

import pytest
from celery import current_app

from apps.core.redis import sync_client
from apps.runs.models import RunEvent, RunStatus
from tests.conftest import run_row, wait_for, wait_status
from tests.factories.runs import event_types, start
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def test_transient_provider_errors_are_retried_then_fail_the_run_with_a_reason(stack: WorkerPool) -> None:
    run = start("flaky")
    failed = wait_status(run.id, RunStatus.FAILED, timeout=30)
    assert failed.error.startswith("mock 500: server_error")
    assert event_types(run.id) == ["user_input", "started", "retry", "retry", "retry", "error"]
    retries = [e.payload["retry"] for e in RunEvent.objects.filter(run_id=run.id, type="retry").order_by("seq")]
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert [r["reason"] for r in retries] == ["exponential backoff"] * 3


def test_stable_mock_never_injects_failures(stack: WorkerPool) -> None:
    assert wait_status(start("stable-fallback").id, RunStatus.COMPLETED).stop_reason == "end_turn"


def test_heartbeat_keeps_the_lease_through_a_call_longer_than_the_lease(stack: WorkerPool) -> None:
    run = start("beyond-lease")  # 5 s call; lease 3 s, heartbeat 1 s, sweeper every 1 s
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert done.lease_token == 1  # claimed exactly once: the lease never expired
    assert event_types(run.id) == ["user_input", "started", "text", "usage", "done"]


def test_a_lost_doorbell_is_rung_again_by_the_sweeper(stack: WorkerPool) -> None:
    current_app.control.cancel_consumer("runs", reply=True, timeout=5, limit=len(stack.pids()))
    try:
        run = start("echo")
        wait_for(lambda: sync_client().llen("runs") == 1)  # the doorbell is in the broker, read by no worker
        assert sync_client().delete("runs") == 1  # the doorbell is gone from the broker
    finally:
        current_app.control.add_consumer("runs", reply=True, timeout=5, limit=len(stack.pids()))
    assert run_row(run.id).status == RunStatus.QUEUED
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=40)  # grace is 10 s in tests
    assert done.step == 1 and event_types(run.id)[-1] == "done"
