"""on_complete hooks (apps.triggers.oncomplete) and the run-finished seam of
apps.runs: iterations run in this process (apps.runs.engine.run_iterate, the
production step), so the engine's announcement reaches the listener here."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.channels.models import ChannelMessage
from apps.memory.selectors import memory_get
from apps.memory.services import Slot
from apps.runs import engine, lifecycle, registry, services
from apps.runs.models import Run
from apps.runs.prompt import Segment
from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.triggers.models import JobState, OnCompleteJob, ScheduleFire, ScheduleState
from apps.triggers.oncomplete import oncomplete_run
from apps.triggers.schedules import schedules_tick
from apps.triggers.services import triggers_finished_sweep
from apps.triggers.tasks import triggers_run_finished_task
from tests.conftest import ALICE

KIND = get_kind("schedule")
ACME = substrate.Author(tenant_id="acme", subject="ops")
SCRIPT = 'Run it. MOCK_SCRIPT: [{"text": "done"}]'
T0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 11, 24, 12, 1, tzinfo=UTC)

pytestmark = pytest.mark.usefixtures("agents", "no_workers")


@pytest.fixture
def heard() -> Iterator[list[tuple[str, str]]]:
    """What the run-finished seam announced during the test."""
    calls: list[tuple[str, str]] = []

    def spy(run_id: str, status: str) -> None:
        calls.append((run_id, status))

    registry.on_run_finished(spy)
    yield calls
    lifecycle._FINISHED.remove(spy)


def fired_run(name: str, **fields: Any) -> str:
    """A schedule's run, fired by the production tick at SLOT; its run id."""
    overlay = {"agent": "scripted", "schedule": "* * * * *", "prompt": SCRIPT, "user_id": "u1", **fields}
    row = ScheduleDef.objects.get(id=substrate.def_create(KIND, ACME, {"name": name, "overlay": overlay})["def_id"])
    schedules_tick(now=T0)
    schedules_tick(now=SLOT)
    return ScheduleFire.objects.get(schedule_def=row).run_id


def test_a_completed_trigger_run_runs_its_hooks_in_order_and_records_them(heard: list[tuple[str, str]]) -> None:
    hooks = [
        {"kind": "memory.set", "scope": "agent", "key": "last", "payload": {"ok": 1}},
        {"kind": "channel.publish", "channel": "not-declared", "payload": 1},
        {"kind": "channel.publish", "channel": "per-user", "payload": "hi"},
    ]
    run_id = fired_run("hooks", on_complete=hooks)
    assert engine.run_iterate(run_id=run_id, step=0) == engine.Outcome.FINISH
    assert heard == [(run_id, "completed")]
    # The iteration only handed the hooks to their own task (no worker here: nothing ran them yet).
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.PENDING
    triggers_run_finished_task(run_id=run_id, status="completed")  # what a worker does with the message
    entry = memory_get(slot=Slot("acme", "agent", "hooks"), key="last")  # scope agent: the schedule's name
    assert entry is not None and entry.value == {"ok": 1}
    [message] = ChannelMessage.objects.filter(tenant_id="acme", channel="per-user", scope_id="u1")
    assert message.payload["schedule_name"] == "hooks" and message.payload["payload"] == "hi"
    results = ScheduleFire.objects.get(run_id=run_id).hook_results or []
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["error"].startswith("channel_not_declared: ")
    state = ScheduleState.objects.get(last_run_id=run_id)
    assert state.last_status == "completed" and "on_complete channel.publish" in state.last_error


def test_hooks_run_once_however_often_the_end_is_announced() -> None:
    hooks = [{"kind": "channel.publish", "channel": "handoff", "payload": "once"}]
    run_id = fired_run("once", on_complete=hooks)
    engine.run_iterate(run_id=run_id, step=0)
    triggers_run_finished_task(run_id=run_id, status="completed")
    triggers_run_finished_task(run_id=run_id, status="completed")  # a redelivered message
    assert oncomplete_run(run_id, "completed") is None  # a redelivered announcement: the claim is gone
    triggers_finished_sweep(grace_seconds=0)
    assert ChannelMessage.objects.filter(tenant_id="acme", channel="handoff").count() == 1
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.DONE


def test_a_lost_hooks_task_is_made_up_by_the_sweep() -> None:
    run_id = fired_run("lost-task", on_complete=[{"kind": "channel.publish", "channel": "handoff", "payload": 1}])
    engine.run_iterate(run_id=run_id, step=0)  # its hooks task is never consumed (no worker here)
    assert triggers_finished_sweep(grace_seconds=0) == 1
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.DONE
    assert ChannelMessage.objects.filter(tenant_id="acme", channel="handoff").count() == 1


def test_a_cancelled_run_is_announced_by_the_cancel_and_runs_no_hook() -> None:
    run_id = fired_run("cancelled-now", on_complete=[{"kind": "channel.publish", "channel": "handoff"}])
    services.run_cancel(principal=ALICE, agent_id=Run.objects.get(id=run_id).agent_id)  # ends outside the engine
    assert triggers_finished_sweep(grace_seconds=0) == 0  # nothing left for the sweep
    job = OnCompleteJob.objects.get(run_id=run_id)
    assert (job.state, job.run_status, job.results) == (JobState.DONE, "cancelled", [])
    assert ScheduleFire.objects.get(run_id=run_id).run_status == "cancelled"
    assert not ChannelMessage.objects.filter(tenant_id="acme", channel="handoff").exists()


def test_a_lost_announcement_is_made_up_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = fired_run("cancelled", on_complete=[{"kind": "channel.publish", "channel": "handoff"}])
    # The process that cancelled it died between its commit and the announcement.
    monkeypatch.setattr(lifecycle, "run_finished", lambda run_id, status: None)
    services.run_cancel(principal=ALICE, agent_id=Run.objects.get(id=run_id).agent_id)
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.PENDING
    assert triggers_finished_sweep(grace_seconds=0) == 1
    job = OnCompleteJob.objects.get(run_id=run_id)
    assert (job.state, job.run_status, job.results) == (JobState.DONE, "cancelled", [])
    assert ScheduleFire.objects.get(run_id=run_id).run_status == "cancelled"
    assert not ChannelMessage.objects.filter(tenant_id="acme", channel="handoff").exists()


def test_a_run_not_created_by_a_trigger_is_not_announced_and_costs_no_trigger_query(
    heard: list[tuple[str, str]],
) -> None:
    data = services.RunCreate(agent="scripted", segments=[Segment(text=SCRIPT)])
    run = services.run_create(principal=ALICE, data=data)
    assert not run.notify_finished
    with CaptureQueriesContext(connection) as queries:
        assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.FINISH
    assert heard == []
    assert not [q["sql"] for q in queries.captured_queries if "triggers_" in q["sql"]]


def test_old_pending_jobs_wait_for_their_run_to_end() -> None:
    run_id = fired_run("still-running", on_complete=[{"kind": "channel.publish", "channel": "handoff"}])
    OnCompleteJob.objects.filter(run_id=run_id).update(created_at=datetime.now(UTC) - timedelta(hours=1))
    assert triggers_finished_sweep(grace_seconds=0) == 0  # queued, not ended: nothing to do yet
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.PENDING
    services.run_cancel(principal=ALICE, agent_id=Run.objects.get(id=run_id).agent_id)  # nothing left queued
