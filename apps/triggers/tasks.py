"""Thin Celery adapters over the trigger services.

Invariant: a tick or a sweep may be late, lost, duplicated or overlap another:
the fire rows' UNIQUE key and the row locks (apps.triggers.schedules), and the
hooks' claim (apps.triggers.oncomplete) make each harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from apps.triggers import schedules, services
from workers.base import AgentTask

TICK_BUDGET_S = 120.0  # one tick's firing loop; overlapping ticks share the rest (well under time_limit)


@shared_task(base=AgentTask, name="maintenance.schedules_tick")
def schedules_tick_task(helper: bool = False, **_: Any) -> int:
    """Fire the due schedules (nothing unless LOOMCYCLE_SCHEDULER_ENABLED=1); the number of fires.
    Beat's tick first starts helper ticks when many schedules are due (helpers start none)."""
    if not settings.LOOMCYCLE.scheduler_enabled or schedules.runtime_paused():
        return 0  # helpers included: nothing is started while the runtime is paused
    for _n in range(0 if helper else schedules.tick_helpers_wanted()):
        schedules_tick_task.apply_async(kwargs={"helper": True}, expires=TICK_BUDGET_S)
    return schedules.schedules_tick(budget_s=TICK_BUDGET_S).fires


@shared_task(base=AgentTask, name=services.HOOKS_TASK)
def triggers_run_finished_task(run_id: str, status: str, **_: Any) -> None:
    """Run the on_complete hooks of a completed trigger run off the engine's path (a duplicate is a no-op)."""
    services.trigger_run_finished_now(run_id, status)


@shared_task(base=AgentTask, name="maintenance.triggers_finished_sweep")
def triggers_finished_sweep_task(**_: Any) -> int:
    """Announce trigger runs whose end the engine could not announce; prune old fire rows and jobs."""
    handled = services.triggers_finished_sweep(grace_seconds=settings.LOOMCYCLE.requeue_grace_seconds)
    services.triggers_prune(retention_days=settings.LOOMCYCLE.triggers_retention_days)
    return handled
