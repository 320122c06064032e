"""Holds a lost worker left behind (issue 37): beat's sweep settles a run's from the
ledger rows its step committed (none: nothing counted), and releases a gateway
call's; the beat tasks are registered with the workers' Celery app."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.budgets import enforce, services
from apps.budgets.models import LimitHold, LimitWindow, TokenLimit
from apps.core.spend import Spender
from apps.gateway.models import UsageEntry, UsageSource
from workers.celery import app

pytestmark = pytest.mark.django_db


def test_the_sweep_settles_a_lost_workers_holds_from_the_ledger() -> None:
    TokenLimit.objects.all().delete()
    services.limit_put(
        spec=services.LimitSpec(tenant_id="", scope="user", scope_id="u-sweep", hard_limit=Decimal(10**6)),
        updated_by="t",
    )
    spender = Spender("", "u-sweep")
    assert enforce.hold(key="run:lost1", step=3, spender=spender).held
    assert enforce.hold(key="run:lost2", step=0, spender=spender).held  # its step never committed
    assert enforce.hold(key="gw:req_lost", step=None, spender=spender).held
    UsageEntry.objects.create(
        created_at=timezone.now(), run_id="lost1", step=3, source=UsageSource.RUN, provider="mock", model="m",
        input_tokens=7, output_tokens=3,
    )  # fmt: skip
    assert LimitWindow.objects.get(limit__scope_id="u-sweep").held == 3
    assert enforce.holds_sweep(older_than=timedelta(minutes=5)) == 0  # young holds belong to calls in flight
    assert enforce.holds_sweep(older_than=timedelta(0), now=timezone.now() + timedelta(seconds=1)) == 3
    window = LimitWindow.objects.get(limit__scope_id="u-sweep")
    assert (window.used, window.held) == (10, 0) and not LimitHold.objects.exists()


def test_the_beat_tasks_are_registered_with_the_workers() -> None:
    app.loader.import_default_modules()
    assert {"maintenance.budgets_wake", "maintenance.budget_holds_sweep"} <= set(app.tasks)
