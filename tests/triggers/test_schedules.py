"""Schedules fired by the tick (apps.triggers.schedules), called in-process
with an explicit clock: the production tick, fed chosen moments. Doorbells go
out on commit, so in these (rolled back) tests the runs stay queued; what is
under test is which fire rows and runs each tick writes. Crossing processes
(two beats, kill -9, hooks of a run that ends) is tests/triggers/test_beat.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from apps.runs.models import Run, RuntimeState, RuntimeStateValue, TranscriptEntry
from apps.substrate import services as substrate
from apps.substrate.kinds import Refused, get_kind
from apps.substrate.models import ScheduleDef
from apps.triggers.models import FireOutcome, OnCompleteJob, ScheduleFire, ScheduleState
from apps.triggers.schedules import schedules_tick, tick_helpers_wanted
from loomcycle_project.bootstrap import load_yaml_config

KIND = get_kind("schedule")
ACME = substrate.Author(tenant_id="acme", subject="ops")
OPS = substrate.Author(tenant_id="", subject="ops", is_admin=True)
T0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)
SCRIPT = 'Run it. MOCK_SCRIPT: [{"text": "done"}]'

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _yaml(db: None) -> None:
    load_yaml_config()


def schedule(name: str, **fields: Any) -> ScheduleDef:
    overlay = {"agent": "scripted", "schedule": "* * * * *", "prompt": SCRIPT, "user_id": name, **fields}
    out = substrate.def_create(KIND, ACME, {"name": name, "overlay": overlay})
    return ScheduleDef.objects.get(id=out["def_id"])


def fires(row: ScheduleDef) -> list[ScheduleFire]:
    return list(ScheduleFire.objects.filter(schedule_def=row).order_by("fire_time"))


def minute(n: int) -> datetime:
    return datetime(2026, 11, 24, 12, n, tzinfo=UTC)


def test_a_due_slot_fires_once_however_many_ticks_see_it() -> None:
    row = schedule("nightly")
    assert schedules_tick(now=T0).seeded == 1  # seeded: the first slot after 12:00:30 is 12:01
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == minute(1)
    assert schedules_tick(now=T0 + timedelta(seconds=29)).fires == 0  # 12:00:59: not due yet
    first = schedules_tick(now=minute(1) + timedelta(seconds=2))
    again = schedules_tick(now=minute(1) + timedelta(seconds=20))
    assert (first.fires, again.fires) == (1, 0)
    [fire] = fires(row)
    assert (fire.fire_time, fire.outcome, fire.counted) == (minute(1), FireOutcome.STARTED, True)
    run = Run.objects.get(id=fire.run_id)
    assert (run.tenant_id, run.user_id, run.agent_name, run.notify_finished) == ("acme", "nightly", "scripted", True)
    state = ScheduleState.objects.get(schedule_def=row)
    assert (state.next_run_at, state.last_run_id, state.last_status, state.fire_count) == (
        minute(2),
        run.id,
        "running",
        1,
    )


def test_a_slot_with_a_fire_row_already_is_not_fired_again() -> None:
    row = schedule("backstop")
    schedules_tick(now=T0)
    ScheduleFire.objects.create(
        schedule_name="backstop", schedule_def=row, tenant_id="acme", fire_time=minute(1), outcome="started"
    )
    assert schedules_tick(now=minute(1) + timedelta(seconds=1)).fires == 0
    assert Run.objects.filter(user_id="backstop").count() == 0
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == minute(2)  # advanced all the same


@pytest.mark.parametrize(("catch_up_max", "expected"), [(0, [10]), (2, [8, 9, 10]), (50, list(range(1, 11)))])
def test_missed_slots_fire_up_to_catch_up_max_oldest_first(catch_up_max: int, expected: list[int]) -> None:
    row = schedule("catchup", catch_up_max=catch_up_max)
    schedules_tick(now=T0)
    result = schedules_tick(now=minute(10) + timedelta(seconds=5))  # down from 12:00:30 to 12:10:05
    assert [f.fire_time for f in fires(row)] == [minute(n) for n in expected]
    assert result.dropped == 10 - len(expected)
    runs = Run.objects.filter(user_id="catchup").order_by("created_at")
    assert [r.id for r in runs] == [f.run_id for f in fires(row)]


def test_disabled_schedule_records_skipped_disabled_and_advances() -> None:
    row = schedule("off", enabled=False)
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    [fire] = fires(row)
    assert (fire.outcome, fire.run_id, fire.counted) == (FireOutcome.SKIPPED_DISABLED, "", False)
    state = ScheduleState.objects.get(schedule_def=row)
    assert (state.last_status, state.next_run_at) == ("skipped_disabled", minute(2))
    assert not Run.objects.filter(user_id="off").exists()


def test_unknown_agent_fails_and_does_not_count_toward_max_fires() -> None:
    row = schedule("ghost", agent="no-such-agent", max_fires=1)
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    schedules_tick(now=minute(2))
    assert [(f.outcome, f.counted) for f in fires(row)] == [(FireOutcome.FAILED, False)] * 2
    assert "unknown_agent" in fires(row)[0].error
    state = ScheduleState.objects.get(schedule_def=row)
    assert (state.last_status, state.fire_count) == ("failed", 0)
    row.refresh_from_db()
    assert not row.retired  # never counted, so never retired


def test_max_fires_retires_the_definition_after_its_last_fire() -> None:
    row = schedule("twice", max_fires=2, catch_up_max=5)
    schedules_tick(now=T0)
    schedules_tick(now=minute(5))  # five slots due, only two may fire
    assert [f.fire_time for f in fires(row)] == [minute(1), minute(2)]
    row.refresh_from_db()
    assert row.retired
    assert ScheduleState.objects.get(schedule_def=row).next_run_at is None
    assert schedules_tick(now=minute(9)).fires == 0


def test_paused_runtime_skips_the_whole_tick() -> None:
    row = schedule("paused")
    schedules_tick(now=T0)
    RuntimeState.objects.update_or_create(id=1, defaults={"state": RuntimeStateValue.PAUSED})
    assert schedules_tick(now=minute(3)).paused
    assert fires(row) == []
    RuntimeState.objects.filter(id=1).update(state=RuntimeStateValue.RUNNING)
    assert schedules_tick(now=minute(3)).fires == 1  # catch_up_max 0: the latest slot only


def test_only_the_active_version_fires() -> None:
    v1 = schedule("versions")
    schedules_tick(now=T0)
    v2_out = substrate.def_fork(KIND, ACME, {"name": "versions", "overlay": {"schedule": "*/2 * * * *"}})
    v2 = ScheduleDef.objects.get(id=v2_out["def_id"])
    schedules_tick(now=minute(1))  # seeds v2 (next: 12:02); v1 is no longer active
    schedules_tick(now=minute(2))
    assert fires(v1) == []
    assert [f.fire_time for f in fires(v2)] == [minute(2)]


def test_cron_runs_in_the_schedule_time_zone() -> None:
    row = schedule("paris", schedule="30 9 * * *", timezone="Europe/Paris")
    schedules_tick(now=T0)
    # 09:30 in Paris on 25 November (UTC+1) is 08:30 UTC.
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == datetime(2026, 11, 25, 8, 30, tzinfo=UTC)


def test_user_tier_schedules_pick_the_def_user_tier() -> None:
    tiers = {"pro": "*/5 * * * *", "free": "0 * * * *"}
    row = schedule("tiers", schedule=None, user_tier="pro", user_tier_schedules=tiers)
    schedules_tick(now=T0)
    assert ScheduleState.objects.get(schedule_def=row).next_run_at == minute(5)


def test_loomcycle_segment_prompts_are_accepted_and_become_run_segments() -> None:
    prompt = [
        {"role": "system", "content": [{"type": "trusted-text", "text": "You summarise."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SCRIPT},
                {"type": "untrusted-block", "kind": "web_content", "text": "<b>feed</b>"},
            ],
        },
    ]
    row = schedule("segments", prompt=prompt)
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    run = Run.objects.get(id=fires(row)[0].run_id)
    assert "You summarise." in run.system
    [first] = TranscriptEntry.objects.filter(run_id=run.id, idx=0)
    text = first.content[0]["text"]
    assert text.startswith(SCRIPT) and "<web_content>\n&lt;b>feed&lt;/b>\n</web_content>" in text


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([{"role": "assistant", "content": [{"type": "text", "text": "x"}]}], "role must be user or system"),
        ([{"role": "user", "content": [{"type": "image", "text": "x"}]}], "each content block must be"),
        ([{"role": "user", "content": [{"type": "text", "text": "x", "kind": "k"}]}], "takes only text, type"),
        ([{"role": "user", "content": []}], "non-empty list"),
        ([{"role": "system", "content": [{"type": "text", "text": "x"}]}], "prompt needs a user message"),
        (42, "prompt must be text, or a list"),
    ],
)
def test_bad_prompts_are_refused_with_a_reason(prompt: Any, message: str) -> None:
    with pytest.raises(Refused, match=message):
        schedule("bad", prompt=prompt)


def test_on_complete_hooks_ride_with_the_run() -> None:
    hooks = [{"kind": "channel.publish", "channel": "handoff", "payload": {"n": 1}}]
    row = schedule("hooked", on_complete=hooks)
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    job = OnCompleteJob.objects.get(run_id=fires(row)[0].run_id)
    assert (job.hooks, job.origin, job.state) == (hooks, {"schedule_name": "hooked"}, "pending")
    assert (job.tenant_id, job.user_id, job.agent_scope_id) == ("acme", "hooked", "hooked")


def test_a_burst_of_due_schedules_asks_for_helper_ticks() -> None:
    rows = [schedule(f"burst-{i}") for i in range(45)]
    schedules_tick(now=T0)
    assert tick_helpers_wanted(now=T0) == 0  # nothing due yet
    assert tick_helpers_wanted(now=minute(1)) == 2  # 45 due: this tick's batch and two helpers' batches
    assert schedules_tick(now=minute(1)).fires == len(rows)
    assert tick_helpers_wanted(now=minute(1)) == 0


def test_django_admin_shows_next_fire_last_run_and_fire_history(admin_client: Client) -> None:
    row = schedule("in-admin", catch_up_max=1)
    schedules_tick(now=T0)
    schedules_tick(now=minute(2))
    run_ids = [f.run_id for f in fires(row)]
    listing = admin_client.get(reverse("admin:triggers_schedulestate_changelist")).content.decode()
    assert "in-admin" in listing and f'<a href="/v1/runs/{run_ids[-1]}">' in listing
    assert "Nov. 24, 2026, 12:03" in listing  # the next fire
    page = admin_client.get(reverse("admin:triggers_schedulestate_change", args=[quote(row.id)])).content.decode()
    assert all(f'<a href="/v1/runs/{run_id}">' in page for run_id in run_ids)  # both fires, linked
    assert f"schedule_def__id__exact={row.id}" in page
    fires_page = admin_client.get(
        reverse("admin:triggers_schedulefire_changelist"), {"schedule_def__id__exact": row.id}
    )
    assert fires_page.status_code == 200 and fires_page.content.decode().count("/v1/runs/r_") == 2


def test_a_shared_schedules_credentials_reach_the_run_sealed_and_only_from_allowlisted_variables(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    import dataclasses

    from apps.runs.credentials import unseal

    monkeypatch.setenv("LOOMCYCLE_SCHED_GH", "gh-token-1234567890")
    monkeypatch.setenv("PARTNER_KEY", "partner-secret-abcdef")
    monkeypatch.setenv("OTHER_KEY", "never-read-0123456789")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, scheduler_env_allowlist=("PARTNER_KEY",))
    creds = {"gh": "LOOMCYCLE_SCHED_GH", "partner": "PARTNER_KEY", "other": "OTHER_KEY"}
    out = substrate.def_create(KIND, OPS, {"name": "with-creds", "overlay": overlay("with-creds", creds)})
    row = ScheduleDef.objects.get(id=out["def_id"])
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    [fire] = fires(row)
    run = Run.objects.get(id=fire.run_id)
    assert unseal(run_id=run.id, sealed=run.credentials_sealed) == {
        "gh": "gh-token-1234567890",
        "partner": "partner-secret-abcdef",
    }  # OTHER_KEY is neither LOOMCYCLE_* nor allowlisted: left out


def overlay(name: str, creds: dict[str, str]) -> dict[str, Any]:
    return {"agent": "scripted", "schedule": "* * * * *", "prompt": SCRIPT, "user_credentials_from_env": creds}


@pytest.mark.parametrize("variable", ["LOOMCYCLE_OTHER_TENANT_WH_SECRET", "LOOMCYCLE_TOKEN", "PARTNER_KEY"])
def test_a_tenants_schedule_may_not_name_a_variable_its_tenant_is_not_given(settings: Any, variable: str) -> None:
    """The environment is one namespace for every tenant: `LOOMCYCLE_*` (another tenant's
    webhook secret, the CLI's admin token) is no licence for a tenant's own row."""
    import dataclasses

    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        scheduler_env_allowlist=("PARTNER_KEY",),
        tenant_credential_env={"bravo": (variable,)},  # given to another tenant only
    )
    with pytest.raises(Refused, match=r"LOOMCYCLE_TENANT_CREDENTIAL_ENV|infrastructure secrets"):
        substrate.def_create(KIND, ACME, {"name": "steal", "overlay": overlay("steal", {"k": variable})})
    assert not ScheduleDef.objects.filter(name="steal").exists()


def test_a_tenants_schedule_reads_the_variables_listed_for_its_tenant_and_no_others(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    import dataclasses

    from apps.runs.credentials import unseal

    monkeypatch.setenv("LOOMCYCLE_ACME_GH", "acme-gh-token-123456")
    monkeypatch.setenv("LOOMCYCLE_BRAVO_WH", "bravo-webhook-secret-42")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, tenant_credential_env={"acme": ("LOOMCYCLE_ACME_GH",)})
    row = schedule("acme-creds", user_credentials_from_env={"gh": "LOOMCYCLE_ACME_GH"})
    # A row stored before the rule (or by hand) naming another tenant's variable: read never.
    ScheduleDef.objects.filter(id=row.id).update(
        definition={
            **row.definition,
            "user_credentials_from_env": {"gh": "LOOMCYCLE_ACME_GH", "wh": "LOOMCYCLE_BRAVO_WH"},
        }
    )
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    [fire] = fires(row)
    run = Run.objects.get(id=fire.run_id)
    assert unseal(run_id=run.id, sealed=run.credentials_sealed) == {"gh": "acme-gh-token-123456"}


def test_a_required_credential_that_does_not_resolve_fails_the_fire_uncounted(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    import dataclasses

    monkeypatch.delenv("LOOMCYCLE_SCHED_MISSING", raising=False)
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, tenant_credential_env={"acme": ("LOOMCYCLE_SCHED_MISSING",)}
    )
    row = schedule(
        "needs-creds",
        user_credentials_from_env={"gh": "LOOMCYCLE_SCHED_MISSING"},
        required_credentials=["gh"],
        max_fires=1,
    )
    schedules_tick(now=T0)
    schedules_tick(now=minute(1))
    [fire] = fires(row)
    assert (fire.outcome, fire.counted, fire.run_id) == (FireOutcome.FAILED, False, "")
    assert fire.error.startswith("credentials_unresolvable: required credentials not resolvable: gh")
    assert not ScheduleDef.objects.get(id=row.id).retired  # a one-shot is not used up by a missing variable
