"""A schedule that fires into a spent budget (issue 37) defers its run (parked
`waiting_budget`) instead of failing the fire, even when the limit says refuse;
the run resumes when the budget frees."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from apps.budgets import services
from apps.budgets.models import TokenLimit
from apps.runs.models import Run, RunStatus
from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.triggers.models import FireOutcome, ScheduleFire
from apps.triggers.schedules import schedules_tick
from loomcycle_project.bootstrap import load_yaml_config

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)


def test_a_fire_into_a_spent_budget_defers_its_run_instead_of_failing() -> None:
    load_yaml_config()
    TokenLimit.objects.all().delete()
    spec = services.LimitSpec(tenant_id="acme", scope="user", scope_id="nightly-b", hard_limit=Decimal(0))
    services.limit_put(spec=spec, updated_by="test")  # on_exceed: refuse, as a 429 for an API caller
    overlay = {"agent": "scripted", "schedule": "* * * * *", "prompt": "go", "user_id": "nightly-b"}
    out = substrate.def_create(
        get_kind("schedule"),
        substrate.Author(tenant_id="acme", subject="ops"),
        {"name": "nightly-b", "overlay": overlay},
    )
    row = ScheduleDef.objects.get(id=out["def_id"])
    schedules_tick(now=T0)
    assert schedules_tick(now=datetime(2026, 11, 24, 12, 1, 2, tzinfo=UTC)).fires == 1
    [fire] = ScheduleFire.objects.filter(schedule_def=row)
    assert fire.outcome == FireOutcome.STARTED and fire.counted
    assert Run.objects.get(id=fire.run_id).status == RunStatus.WAITING_BUDGET
    services.limit_put(spec=services.LimitSpec(tenant_id="acme", scope="user", scope_id="nightly-b"), updated_by="t")
    assert services.budgets_wake(now=T0 + timedelta(minutes=5)) == 1  # the hard limit is gone: it resumes
    assert Run.objects.get(id=fire.run_id).status == RunStatus.RUNNING
    TokenLimit.objects.all().delete()
