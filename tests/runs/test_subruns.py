"""Sub-agents through the Agent tool: parks, wake-ups, depth, failures, cancel cascade."""

from __future__ import annotations

import time

import pytest

from apps.runs import services
from apps.runs.children.report import run_child_finished
from apps.runs.models import Run, RunEvent, RunStatus, ToolCallRecord
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.runs import assert_consecutive, event_types, start
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def tool_results(run_id: str) -> list[dict[str, object]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")]


def test_spawned_child_runs_and_wakes_its_parent_with_the_result(stack: WorkerPool) -> None:
    parent = start("spawner")
    done = wait_status(parent.id, RunStatus.COMPLETED, timeout=30)
    child = Run.objects.get(parent_id=parent.id)
    assert (child.agent_name, child.status, child.depth, child.reported_to_parent) == ("echo", "completed", 1, True)
    assert event_types(parent.id) == [
        "user_input",
        "started",
        "tool_call",
        "usage",
        "tool_result",
        "text",
        "usage",
        "done",
    ]
    [result] = tool_results(parent.id)
    assert result["text"] == f"[sub-agent agent_id={child.agent_id}]\nok" and result["is_error"] is False
    assert done.pending_calls == 0 and done.step == 2
    assert ToolCallRecord.objects.get(run_id=parent.id).status == "finished"
    assert_consecutive(parent.id)
    assert run_child_finished(child_id=child.id) is False  # reported exactly once


def test_parent_waits_as_a_row_while_its_child_runs(stack: WorkerPool) -> None:
    parent = start("slow-spawner")
    child = wait_for(lambda: Run.objects.filter(parent_id=parent.id).first())
    waiting = wait_status(parent.id, RunStatus.WAITING_CHILDREN)
    assert waiting.lease_owner == "" and waiting.pending_calls == 1
    t0 = time.monotonic()
    services.run_cancel(principal=ALICE, agent_id=parent.agent_id)
    wait_for(lambda: run_row(child.id).status == RunStatus.CANCELLED, timeout=5, interval=0.01)
    assert time.monotonic() - t0 < 1.0
    assert run_row(parent.id).status == RunStatus.CANCELLED
    assert run_row(child.id).stop_reason == "parent run cancelled"


def test_a_failed_child_is_an_error_result_and_the_parent_goes_on(stack: WorkerPool) -> None:
    parent = start("flaky-spawner")
    done = wait_status(parent.id, RunStatus.COMPLETED, timeout=40)
    [result] = tool_results(parent.id)
    assert result["is_error"] is True and "failed: mock 500" in str(result["text"])
    assert done.stop_reason == "end_turn"


def test_unknown_child_agent_is_refused_without_parking(stack: WorkerPool) -> None:
    parent = start("ghost-spawner")
    wait_status(parent.id, RunStatus.COMPLETED)
    [result] = tool_results(parent.id)
    assert result["is_error"] is True and "unknown agent" in str(result["text"])
    assert not Run.objects.filter(parent_id=parent.id).exists()


def test_depth_limit_refuses_the_fourth_generation(stack: WorkerPool) -> None:
    root = start("recursor")
    wait_status(root.id, RunStatus.COMPLETED, timeout=60)
    depths = sorted(Run.objects.values_list("depth", flat=True))
    assert depths == [0, 1, 2, 3]
    deepest = Run.objects.get(depth=3)
    [refusal] = tool_results(deepest.id)
    assert refusal["is_error"] is True and "depth limit (3)" in str(refusal["text"])
    assert all(r.status == RunStatus.COMPLETED for r in Run.objects.all())


def test_a_report_to_a_parent_that_waits_for_no_call_is_dropped(no_workers: None) -> None:
    """A child whose parent never parked for it (made with parent_id by hand,
    as an import or an operator might) must not drive the parent's pending
    call count below zero: its report is dropped and the parent is untouched."""
    from apps.runs.prompt import Segment

    def create(agent: str, parent_id: str | None = None) -> Run:
        data = services.RunCreate(agent=agent, segments=[Segment(text="hi")], user_id="u", parent_id=parent_id)
        return services.run_create(principal=ALICE, data=data)

    parent = create("echo")
    child = create("echo", parent.id)
    Run.objects.filter(id=parent.id).update(status=RunStatus.RUNNING)
    before = run_row(parent.id)
    services.run_cancel(principal=ALICE, agent_id=child.agent_id)
    assert run_row(child.id).status == RunStatus.CANCELLED
    run_child_finished(child_id=child.id)
    after = run_row(parent.id)
    assert (after.pending_calls, after.last_seq, after.status) == (0, before.last_seq, RunStatus.RUNNING)
    assert run_row(child.id).reported_to_parent is True
