"""Review fixes of the schedules (apps.triggers.schedules, services, cron):
versions sharing one schedule identity (rollback, edits keeping a pause),
seeding from the activation time, late ticks, DST fall-back, infrastructure
failures, stored prompts no run can start from, tenant isolation of the admin
verbs, the finished sweep's batches and the retention prune. In-process
ticks with an explicit clock, as tests/triggers/test_schedules.py."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from apps.core.errors import NotFound
from apps.core.redis import sync_client
from apps.core.scopes import TENANT
from apps.core.types import Principal
from apps.gateway import fairness
from apps.gateway.fairness import FairnessUnavailable
from apps.runs.models import Run, RuntimeState, RuntimeStateValue
from apps.substrate import services as substrate
from apps.substrate.kinds import Refused, get_kind
from apps.substrate.models import ScheduleDef
from apps.triggers import services
from apps.triggers.cron import due_slots, next_after
from apps.triggers.models import FireOutcome, JobState, OnCompleteJob, ScheduleFire, ScheduleState
from apps.triggers.oncomplete import oncomplete_run
from apps.triggers.schedules import schedules_tick
from apps.triggers.tasks import schedules_tick_task
from loomcycle_project.bootstrap import load_yaml_config
from workers.queues import MAINTENANCE

KIND = get_kind("schedule")
ACME = substrate.Author(tenant_id="acme", subject="ops")
ACME_OPS = Principal(tenant_id="acme", subject="ops", scopes=frozenset({TENANT}))
GLOBEX_OPS = Principal(tenant_id="globex", subject="ops", scopes=frozenset({TENANT}))
T0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)
SCRIPT = 'Run it. MOCK_SCRIPT: [{"text": "done"}]'
NY = "America/New_York"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _yaml(db: None) -> None:
    load_yaml_config()


def schedule(name: str, **fields: Any) -> ScheduleDef:
    overlay = {"agent": "scripted", "schedule": "* * * * *", "prompt": SCRIPT, "user_id": name, **fields}
    out = substrate.def_create(KIND, ACME, {"name": name, "overlay": overlay})
    return ScheduleDef.objects.get(id=out["def_id"])


def fork(row: ScheduleDef, **overlay: Any) -> ScheduleDef:
    out = substrate.def_fork(KIND, ACME, {"name": row.name, "parent_def_id": row.id, "overlay": overlay})
    return ScheduleDef.objects.get(id=out["def_id"])


def minute(n: int) -> datetime:
    return datetime(2026, 11, 24, 12, n, tzinfo=UTC)


def slots_fired(name: str) -> list[tuple[datetime, str]]:
    rows = ScheduleFire.objects.filter(tenant_id="acme", schedule_name=name).order_by("fire_time")
    return [(f.fire_time, f.schedule_def_id) for f in rows]


# --- 1. versions share the schedule's slots and its pause ----------------------------


def test_rolling_back_to_an_old_version_does_not_fire_a_slot_again() -> None:
    v1 = schedule("rollback")
    schedules_tick(now=T0)
    schedules_tick(now=minute(1) + timedelta(seconds=1))  # v1 fires 12:01
    v2 = fork(v1, prompt="Second version. " + SCRIPT)
    schedules_tick(now=minute(2) + timedelta(seconds=1))  # v2 seeded from v1's unfired 12:02: fires it
    substrate.def_promote(KIND, ACME, {"def_id": v1.id})  # roll back
    schedules_tick(now=minute(2) + timedelta(seconds=20))  # v1 re-seeded from v2's next slot: nothing due
    schedules_tick(now=minute(3) + timedelta(seconds=1))
    assert slots_fired("rollback") == [(minute(1), v1.id), (minute(2), v2.id), (minute(3), v1.id)]
    assert Run.objects.filter(user_id="rollback").count() == 3


def test_the_slot_key_holds_across_versions() -> None:
    v1 = schedule("slotkey")
    schedules_tick(now=T0)
    v2 = fork(v1, prompt="v2 " + SCRIPT)
    schedules_tick(now=T0 + timedelta(seconds=10))  # v2 seeded: next 12:01
    ScheduleFire.objects.create(  # v1 fired 12:01 (a tick racing the promote)
        schedule_name="slotkey", schedule_def=v1, tenant_id="acme", fire_time=minute(1), outcome="started"
    )
    schedules_tick(now=minute(1) + timedelta(seconds=1))
    assert slots_fired("slotkey") == [(minute(1), v1.id)]
    assert ScheduleState.objects.get(schedule_def=v2).next_run_at == minute(2)


def test_a_pause_survives_add_hook_and_fork() -> None:
    v1 = schedule("paused")
    schedules_tick(now=T0)
    services.schedule_pause(principal=ACME_OPS, def_id=v1.id)
    hook = {"kind": "channel.publish", "channel": "handoff", "payload": {}}
    v2_id = substrate.def_dispatch(KIND, ACME, {"op": "add_hook", "def_id": v1.id, "hook": hook})["def_id"]
    v3 = fork(ScheduleDef.objects.get(id=v2_id), prompt="v3 " + SCRIPT)
    assert schedules_tick(now=minute(5)).fires == 0
    assert ScheduleState.objects.get(schedule_def=v3).paused_until == services.PAUSED_FOREVER
    assert slots_fired("paused") == []
    services.schedule_resume(principal=ACME_OPS, def_id=v3.id)
    assert services.schedule_state(principal=ACME_OPS, def_id=v3.id)["def_id"] == v3.id


def test_un_retiring_a_one_shot_lets_it_fire_again() -> None:
    row = schedule("oneshot", max_fires=1)
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    row.refresh_from_db()
    assert row.retired
    substrate.def_retire(KIND, ACME, {"def_id": row.id, "retired": False})
    state = ScheduleState.objects.get(schedule_def=row)
    assert state.fire_count == 0 and state.next_run_at is not None


# --- 2. seeding from the activation time -----------------------------------------------


def test_a_slot_between_activation_and_the_first_tick_fires() -> None:
    row = schedule("daily", schedule="0 9 * * *")
    activated = datetime(2026, 11, 24, 8, 59, 45, tzinfo=UTC)
    ScheduleDef.objects.filter(id=row.id).update(created_at=activated)
    KIND.pointer._default_manager.filter(active_def_id=row.id).update(promoted_at=activated)
    schedules_tick(now=datetime(2026, 11, 24, 9, 0, 10, tzinfo=UTC))  # first seen after 09:00
    assert slots_fired("daily") == [(datetime(2026, 11, 24, 9, 0, tzinfo=UTC), row.id)]


def test_a_version_replacing_a_retired_one_starts_from_its_activation() -> None:
    v1 = schedule("after-retire", schedule="0 9 * * *")
    schedules_tick(now=datetime(2026, 11, 20, 12, 0, tzinfo=UTC))  # v1: next 11-21 09:00, never fired
    substrate.def_retire(KIND, ACME, {"def_id": v1.id, "retired": True})
    v2 = schedule("after-retire", schedule="0 9 * * *")
    activated = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
    ScheduleDef.objects.filter(id=v2.id).update(created_at=activated)
    KIND.pointer._default_manager.filter(active_def_id=v2.id).update(promoted_at=activated)
    schedules_tick(now=activated + timedelta(seconds=10))
    assert slots_fired("after-retire") == []  # not today's 09:00, before v2 existed
    assert ScheduleState.objects.get(schedule_def=v2).next_run_at == datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


# --- 10. a late tick keeps its slots; downtime obeys catch_up_max ----------------------


def test_a_late_tick_fires_every_slot_due_since_the_previous_tick() -> None:
    row = schedule("late", catch_up_max=0)
    schedules_tick(now=T0)
    result = schedules_tick(now=minute(2) + timedelta(seconds=5))  # 95 s late: 12:01 and 12:02 due
    assert slots_fired("late") == [(minute(1), row.id), (minute(2), row.id)]
    assert result.dropped == 0


def test_after_downtime_catch_up_max_0_fires_only_the_latest() -> None:
    row = schedule("down", catch_up_max=0)
    schedules_tick(now=T0)
    result = schedules_tick(now=minute(30) + timedelta(seconds=5))
    assert slots_fired("down") == [(minute(30), row.id)]
    assert result.dropped == 29


def test_catch_up_max_above_100_is_refused() -> None:
    with pytest.raises(Refused, match="catch_up_max must be at most 100"):
        schedule("greedy", catch_up_max=101)


def test_the_dropped_count_stops_at_its_cap() -> None:
    slots, dropped = due_slots("* * * * *", "UTC", first=minute(0) - timedelta(days=7), now=minute(0), keep=1)
    assert (slots, dropped) == ([minute(0)], 100)


# --- 4. DST fall-back ------------------------------------------------------------------


def test_a_fixed_hour_fires_once_on_a_dst_fall_back_night() -> None:
    first = datetime(2025, 11, 2, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert next_after("30 1 * * *", NY, first) == datetime(2025, 11, 3, 6, 30, tzinfo=UTC)
    assert next_after("30 * * * *", NY, first) == datetime(2025, 11, 2, 6, 30, tzinfo=UTC)  # 01:30 EST too
    row = schedule("fallback", schedule="30 1 * * *", timezone=NY)
    schedules_tick(now=datetime(2025, 11, 1, 12, 0, tzinfo=UTC))
    schedules_tick(now=first + timedelta(seconds=5))
    schedules_tick(now=datetime(2025, 11, 2, 6, 30, 5, tzinfo=UTC))  # 01:30 EST: the repeat
    assert slots_fired("fallback") == [(first, row.id)]
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == datetime(2025, 11, 3, 6, 30, tzinfo=UTC)


# --- 3. infrastructure failures are retried, not recorded --------------------------------


@pytest.mark.parametrize(
    "failure",
    [FairnessUnavailable("concurrency stats are unavailable: down"), redis.ConnectionError("Connection refused")],
)
def test_an_infrastructure_failure_at_fire_time_is_retried_next_tick_uncounted(
    failure: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection as in test_oncomplete: admission raises what it raises when Redis is down."""
    row = schedule("outage", max_fires=1)
    schedules_tick(now=T0)

    def down(**_: Any) -> None:
        raise failure

    with monkeypatch.context() as patch:
        patch.setattr(fairness, "run_slot_take", down)
        result = schedules_tick(now=minute(1) + timedelta(seconds=1))
    assert result.fires == 0
    state = ScheduleState.objects.get(schedule_def=row)
    assert (state.next_run_at, state.fire_count, state.last_status) == (minute(1), 0, "")
    assert slots_fired("outage") == []
    row.refresh_from_db()
    assert not row.retired
    schedules_tick(now=minute(1) + timedelta(seconds=30))  # back: the same slot fires, once
    assert slots_fired("outage") == [(minute(1), row.id)]


# --- 9. prompts no run can start from --------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("   ", "prompt is blank"),
        ([{"role": "user", "content": [{"type": "text", "text": "  "}]}], "user messages are blank"),
    ],
)
def test_blank_prompts_are_refused(prompt: Any, message: str) -> None:
    with pytest.raises(Refused, match=message):
        schedule("blank", prompt=prompt)


def test_a_stored_assistant_prompt_fails_each_fire_uncounted_without_parking() -> None:
    row = schedule("legacy", max_fires=1)
    old = [{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]
    ScheduleDef.objects.filter(id=row.id).update(definition={**row.definition, "prompt": old})
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    schedules_tick(now=minute(2))
    outcomes = [(f.outcome, f.counted) for f in ScheduleFire.objects.filter(schedule_def=row).order_by("fire_time")]
    assert outcomes == [(FireOutcome.FAILED, False)] * 2
    assert "prompt_invalid" in ScheduleFire.objects.filter(schedule_def=row).first().error  # type: ignore[union-attr]
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == minute(3)  # advanced, not parked an hour


# --- 10. tenant isolation of the admin verbs --------------------------------------------


@pytest.mark.parametrize("verb", ["schedule_state", "schedule_pause", "schedule_resume", "schedule_run_now"])
def test_another_tenants_schedule_is_not_found(verb: str) -> None:
    row = schedule("private")
    with pytest.raises(NotFound) as caught:
        getattr(services, verb)(principal=GLOBEX_OPS, def_id=row.id)
    assert caught.value.status == 404
    assert ScheduleState.objects.filter(schedule_def=row, paused_until__isnull=False).count() == 0


# --- 7. every hook failure is recorded ---------------------------------------------------


def test_a_hook_raising_a_non_application_error_is_recorded_and_the_next_hook_runs() -> None:
    schedule("hooked")
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    run_id = ScheduleFire.objects.get(schedule_name="hooked").run_id
    hooks = [
        {"kind": "memory.set", "scope": "agent", "key": "k" * 600, "payload": 1},  # over the column: a DataError
        {"kind": "memory.set", "scope": "agent", "key": "good", "payload": 2},
    ]
    OnCompleteJob.objects.create(run_id=run_id, tenant_id="acme", agent_scope_id="hooked", hooks=hooks)
    results = oncomplete_run(run_id, "completed")
    assert results is not None
    assert [(r["kind"], r["ok"]) for r in results] == [("memory.set", False), ("memory.set", True)]
    assert results[0]["error"].startswith("internal:")
    assert OnCompleteJob.objects.get(run_id=run_id).state == JobState.DONE


# --- 6. the finished sweep and the retention prune ---------------------------------------


def test_the_sweep_handles_ended_runs_even_behind_a_batch_of_running_ones() -> None:
    for n in range(3):
        schedule(f"busy{n}")
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    fires = list(ScheduleFire.objects.filter(tenant_id="acme").order_by("fire_time", "id"))
    ended = fires[-1]
    Run.objects.filter(id=ended.run_id).update(status="failed")
    assert services.triggers_finished_sweep(grace_seconds=-60, batch=1) == 1
    ended.refresh_from_db()
    assert ended.run_status == "failed"


def test_the_prune_keeps_each_schedules_latest_fire() -> None:
    row = schedule("old", catch_up_max=5)
    schedules_tick(now=T0)
    schedules_tick(now=minute(3))
    ScheduleFire.objects.filter(schedule_def=row).update(fired_at=datetime.now(UTC) - timedelta(days=40))
    fires, _jobs = services.triggers_prune(retention_days=30)
    assert fires == 2
    assert [t for t, _ in slots_fired("old")] == [minute(3)]


# --- 10. no helper tick is started while the runtime is paused ---------------------------


def test_a_paused_runtime_starts_no_helper_ticks(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, scheduler_enabled=True)
    for n in range(25):  # more than one claim batch due: a running tick would start a helper
        schedule(f"burst{n}")
    schedules_tick(now=T0)
    ScheduleState.objects.filter(tenant_id="acme").update(next_run_at=T0)
    RuntimeState.objects.update_or_create(id=1, defaults={"state": RuntimeStateValue.PAUSED})
    queued = sync_client().llen(MAINTENANCE)
    assert schedules_tick_task(helper=False) == 0
    assert sync_client().llen(MAINTENANCE) == queued
