"""The iteration contract against real Postgres, Redis and Celery worker processes."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from celery import current_app

from apps.core.errors import RuntimePaused
from apps.core.redis import sync_client
from apps.runs import engine, services
from apps.runs.models import Run, RunStatus, ToolCallRecord, TranscriptEntry
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.runs import assert_consecutive, event_types, start
from tests.procs import WorkerPool
from workers.queues import RUNS

pytestmark = pytest.mark.usefixtures("agents")


def test_tool_calling_run_of_three_iterations_has_exact_events_and_transcript(stack: WorkerPool) -> None:
    run = start("toolcaller")
    done = wait_status(run.id, RunStatus.COMPLETED)
    assert event_types(run.id) == [
        "user_input",
        "system_prompt",
        "started",
        "tool_call",
        "usage",
        "tool_result",
        "tool_call",
        "usage",
        "tool_result",
        "text",
        "usage",
        "done",
    ]
    rows = list(TranscriptEntry.objects.filter(run_id=run.id).order_by("idx"))
    assert [(r.role, [b["type"] for b in r.content]) for r in rows] == [
        ("user", ["text"]),
        ("assistant", ["tool_use"]),
        ("user", ["tool_result"]),
        ("assistant", ["tool_use"]),
        ("user", ["tool_result"]),
        ("assistant", ["text"]),
    ]
    assert done.step == 3 and done.stop_reason == "end_turn" and done.last_seq == 12
    assert rows[-1].content[0]["text"] == "done"
    calls = list(ToolCallRecord.objects.filter(run_id=run.id).order_by("step"))
    assert [(c.step, c.name, c.status, c.is_error) for c in calls] == [
        (0, "Context", "finished", False),
        (1, "Context", "finished", False),
    ]
    assert done.usage["input_tokens"] > 0 and done.usage["provider"] == "mock"
    assert_consecutive(run.id)


def _no_delivery_left(run_id: str) -> bool:
    """No doorbell of `run_id` is queued, prefetched or being run by any worker."""
    if sync_client().llen(RUNS):
        return False
    inspect = current_app.control.inspect(timeout=2)
    held = [*(inspect.active() or {}).values(), *(inspect.reserved() or {}).values()]
    return not [t for tasks in held for t in tasks if run_id in f"{t.get('args')}{t.get('kwargs')}"]


def test_duplicate_and_stale_deliveries_are_noops(stack: WorkerPool) -> None:
    run = start("slow")
    wait_for(lambda: run_row(run.id).lease_owner)  # step 0 is in flight on a worker
    for _ in range(2):  # the same doorbell again, while the lease is held
        current_app.send_task("runs.iterate", args=(run.id, 0))
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    wait_for(lambda: _no_delivery_left(run.id), timeout=30)  # the duplicates were consumed
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.NOOP  # stale step
    assert engine.run_iterate(run_id=run.id, step=1) == engine.Outcome.NOOP  # terminal run
    assert engine.run_iterate(run_id=run.id, step=7) == engine.Outcome.NOOP  # future step
    assert event_types(run.id) == ["user_input", "started", "text", "usage", "done"]
    assert TranscriptEntry.objects.filter(run_id=run.id).count() == 2
    assert run_row(run.id).step == done.step == 1
    assert_consecutive(run.id)


def _owner_pid(run_id: str) -> int:
    """The pid in the lease owner's worker id (`<host>:<pid>:<boot token>`), 0 when unleased."""
    owner = run_row(run_id).lease_owner
    return int(owner.split(":")[-2]) if owner else 0


def test_worker_killed_mid_iteration_run_completes_on_another_worker(stack: WorkerPool) -> None:
    run = start("slow")
    pid = wait_for(lambda: _owner_pid(run.id))
    assert pid in stack.pids()
    stack.kill(pid)  # kill -9 inside the slow provider call
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=40)
    assert _owner_pid(run.id) == 0 and done.attempts == 0
    assert event_types(run.id) == ["user_input", "started", "text", "usage", "done"]
    assert TranscriptEntry.objects.filter(run_id=run.id).count() == 2
    assert_consecutive(run.id)


def test_poison_iteration_fails_the_run_after_the_attempt_limit(stack: WorkerPool) -> None:
    run = start("crash")

    def failed() -> bool:
        stack.ensure()  # the supervisor's job in `manage.py up`: replace dead workers
        return run_row(run.id).status == RunStatus.FAILED

    wait_for(failed, timeout=90, interval=0.3)
    row = run_row(run.id)
    assert "giving up after 3 attempts" in row.error
    assert event_types(run.id)[-1] == "error"
    assert TranscriptEntry.objects.filter(run_id=run.id).count() == 1  # only the prompt
    assert_consecutive(run.id)


def test_cancel_during_provider_call_lands_within_a_second_and_cascades(stack: WorkerPool) -> None:
    parent = start("very-slow")
    child = start("very-slow", parent_id=parent.id)
    grandchild = start("very-slow", parent_id=child.id)
    for r in (parent, child, grandchild):
        wait_for(lambda r=r: run_row(r.id).lease_owner)  # all three inside a 20 s provider call
    t0 = time.monotonic()
    out = services.run_cancel(principal=ALICE, agent_id=parent.agent_id)
    assert set(out["cascaded"]) == {child.agent_id, grandchild.agent_id}
    wait_for(
        lambda: all(run_row(r.id).status == RunStatus.CANCELLED for r in (parent, child, grandchild)),
        timeout=5,
        interval=0.01,
    )
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, f"cancel took {elapsed:.2f} s"
    assert run_row(child.id).stop_reason == "parent run cancelled"
    assert run_row(parent.id).stop_reason == "cancelled by api"
    assert event_types(parent.id)[-1] == "done"
    again = services.run_cancel(principal=ALICE, agent_id=parent.agent_id)
    assert again == {"cancelled": False, "agent_id": parent.agent_id, "status": "cancelled"}


def test_pause_parks_every_run_and_resume_completes_them(stack: WorkerPool) -> None:
    runs = [start("ticker") for _ in range(6)]
    wait_for(lambda: Run.objects.filter(step__gte=1).exists())
    out = async_to_sync(services.runtime_pause)(timeout_ms=10_000)
    assert out["warnings"] == [] and out["paused_runs_count"] == 6
    statuses = {run_row(r.id).status for r in runs}
    assert statuses == {RunStatus.PAUSED}
    steps = {r.id: run_row(r.id).step for r in runs}
    time.sleep(1.5)  # nothing moves while paused
    assert {r.id: run_row(r.id).step for r in runs} == steps
    with pytest.raises(RuntimePaused):
        start("echo")
    assert services.runtime_resume()["resumed_runs_count"] == 6
    for r in runs:
        done = wait_status(r.id, RunStatus.COMPLETED, timeout=30)
        assert done.step == 3
        assert_consecutive(r.id)


def test_interactive_run_parks_without_a_worker_and_continues_on_input(stack: WorkerPool) -> None:
    run = start("chat")
    parked = wait_status(run.id, RunStatus.AWAITING_INPUT)
    assert parked.lease_owner == "" and parked.lease_until is None
    inspect = current_app.control.inspect(timeout=2)
    active = inspect.active() or {}
    # No worker holds the parked run (other tests' tasks may be running on the shared workers).
    assert not [t for tasks in active.values() for t in tasks if run.id in f"{t.get('args')}{t.get('kwargs')}"]
    services.run_input(principal=ALICE, run_id=run.id, text="and again")
    wait_for(lambda: run_row(run.id).step == 2 and run_row(run.id).status == RunStatus.AWAITING_INPUT)
    assert event_types(run.id) == [
        "user_input",
        "started",
        "text",
        "usage",
        "awaiting_input",
        "user_input",
        "text",
        "usage",
        "awaiting_input",
    ]
    rows = list(TranscriptEntry.objects.filter(run_id=run.id).order_by("idx").values_list("role", flat=True))
    assert rows == ["user", "assistant", "user", "assistant"]
    services.run_cancel(principal=ALICE, agent_id=run.agent_id)
    assert run_row(run.id).status == RunStatus.CANCELLED  # parked runs are cancelled in place
