"""Thin Celery adapters: beat wakes the deferred runs whose budgets freed, and settles
the holds a lost worker left (dropping the rolling windows' spend rows no cutoff needs).
A late, lost or duplicated tick is harmless: the wake is
a conditional UPDATE, the settle takes the hold rows' locks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

from apps.budgets import enforce, services
from workers.base import AgentTask


@shared_task(base=AgentTask, name="maintenance.budgets_wake")
def budgets_wake_task(**_: Any) -> int:
    return services.budgets_wake()


@shared_task(base=AgentTask, name="maintenance.budget_holds_sweep")
def budget_holds_sweep_task(**_: Any) -> int:
    return enforce.holds_sweep(older_than=timedelta(seconds=2 * settings.LOOMCYCLE.lease_seconds))
