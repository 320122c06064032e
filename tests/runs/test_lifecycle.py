"""A run's end has one fan-out (apps.runs.lifecycle.run_ended), whoever ends it: each way a run
can end calls it once, with the run's own row, and the wings' after-effects follow the same
conditions (a top-level run's end starts its session's next run; a child's end reports to its
parent). Runs iterate in this process (`no_workers`), so every after-effect is seen here."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from apps.runs import engine, lifecycle, services, store
from apps.runs.lifecycle import Ended
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from apps.runs.sessions import services as session_services
from tests.conftest import ALICE

pytestmark = pytest.mark.usefixtures("agents", "no_workers")


@pytest.fixture
def ended() -> Iterator[dict[str, list[Ended]]]:
    """What run_ended told a subscriber of every run, and of children and top-level runs only."""
    heard: dict[str, list[Ended]] = {"all": [], "child": [], "top": []}
    spies = [
        (heard["all"].append, lambda e: True),
        (heard["child"].append, lifecycle.is_child),
        (heard["top"].append, lifecycle.is_top_level),
    ]
    for spy, when in spies:
        lifecycle.subscribe(spy, when=when)
    yield heard
    lifecycle._SUBSCRIBERS[:] = [s for s in lifecycle._SUBSCRIBERS if all(s[0] is not spy for spy, _ in spies)]


def start(agent: str, text: str = "hi") -> Run:
    return services.run_create(principal=ALICE, data=services.RunCreate(agent=agent, segments=[Segment(text=text)]))


def scripted() -> Run:
    return start("scripted", "P MOCK_SCRIPT: " + json.dumps([{"text": "x"}]))


def enqueue_behind(run: Run) -> Run:
    data = services.RunCreate(agent="", segments=[Segment(text="later")], multitask_strategy="enqueue")
    queued = session_services.session_continue(principal=ALICE, session_id=run.session_id, data=data)
    assert queued.status == RunStatus.WAITING_SESSION
    return queued


def iterate_to_end(run: Run) -> None:
    for step in range(10):
        if engine.run_iterate(run_id=run.id, step=step) == engine.Outcome.FINISH:
            return
    raise AssertionError(f"run {run.id} did not finish")


def status(run: Run) -> str:
    return Run.objects.get(id=run.id).status


def test_a_completed_run_ends_once_and_starts_its_sessions_next_run(ended: dict[str, list[Ended]]) -> None:
    run = scripted()
    later = enqueue_behind(run)
    iterate_to_end(run)
    assert [(e.run_id, e.status, e.parent_id) for e in ended["all"]] == [(run.id, RunStatus.COMPLETED, None)]
    assert ended["top"] == ended["all"] and ended["child"] == []
    assert status(later) == RunStatus.QUEUED  # the sessions wing's subscriber promoted it
    services.run_cancel(principal=ALICE, run_id=later.id)  # nothing left queued for the flush to wait on


def test_a_failed_run_ends_once_through_the_same_fan_out(ended: dict[str, list[Ended]]) -> None:
    run = start("flaky")  # every provider call fails with a 500
    later = enqueue_behind(run)
    iterate_to_end(run)
    assert status(run) == RunStatus.FAILED
    assert [(e.run_id, e.status) for e in ended["all"]] == [(run.id, RunStatus.FAILED)]
    assert status(later) == RunStatus.QUEUED
    services.run_cancel(principal=ALICE, run_id=later.id)


def test_a_cancelled_run_that_no_worker_holds_ends_through_the_same_fan_out(ended: dict[str, list[Ended]]) -> None:
    run = scripted()
    later = enqueue_behind(run)
    services.run_cancel(principal=ALICE, run_id=run.id)
    assert [(e.run_id, e.status, e.tools) for e in ended["all"]] == [
        (run.id, RunStatus.CANCELLED, tuple(Run.objects.get(id=run.id).tools))
    ]
    assert status(later) == RunStatus.QUEUED  # the same rule as the engine's finish
    services.run_cancel(principal=ALICE, run_id=later.id)


def test_a_run_cancelled_while_parked_and_its_orphaned_child_each_end_once(ended: dict[str, list[Ended]]) -> None:
    parent = start("slow-spawner")
    assert engine.run_iterate(run_id=parent.id, step=0) == engine.Outcome.PARK
    child = Run.objects.get(parent_id=parent.id)
    assert (status(parent), status(child)) == (RunStatus.WAITING_CHILDREN, RunStatus.QUEUED)
    store.session_cancel_mark(run_ids=[parent.id], reason="test")  # a cancel that never finished it
    assert services.run_parked_cancels_finish() == 1  # cancelled while parked: the sweep finishes it
    assert [(e.run_id, e.status) for e in ended["top"]] == [(parent.id, RunStatus.CANCELLED)]
    assert ended["child"] == [] and status(child) == RunStatus.QUEUED  # its child is now an orphan
    assert services.run_orphans_cancel() == 1  # orphaned: the lease sweep's backstop ends it
    assert [(e.run_id, e.status, e.parent_id) for e in ended["child"]] == [(child.id, RunStatus.CANCELLED, parent.id)]
    assert [e.run_id for e in ended["all"]] == [parent.id, child.id]  # each end once, no other
    assert Run.objects.get(id=child.id).reported_to_parent  # the children wing's report ran for the child
