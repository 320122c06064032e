"""Runs parked over a budget (`waiting_budget`, apps.runs.engine.budget): who they
spend for, and the one conditional move that wakes them (exactly once)."""

from __future__ import annotations

from django.db.models import Count
from django.utils import timezone

from apps.runs.models import Run
from apps.runs.statuses import RunStatus


def budget_waiting_spenders(*, limit: int = 10_000) -> list[tuple[str, str, str, int]]:
    """(tenant, user, agent, count) of the runs waiting for a budget (index run_user_status)."""
    rows = (
        Run.objects.filter(status=RunStatus.WAITING_BUDGET)
        .values_list("tenant_id", "user_id", "agent_name")
        .annotate(n=Count("id"))
        .order_by()[:limit]
    )
    return [(str(t), str(u), str(a), int(n)) for t, u, a, n in rows]


def budget_waiting_wake(*, tenant_id: str, user_id: str, agent: str) -> list[tuple[str, int]]:
    """Flip this spender's waiting_budget runs to `running` (`WHERE status = 'waiting_budget'`:
    a second waker finds none); their (id, step) doorbells, for after the commit."""
    ids = list(
        Run.objects.select_for_update(skip_locked=True)
        .filter(status=RunStatus.WAITING_BUDGET, tenant_id=tenant_id, user_id=user_id, agent_name=agent)
        .values_list("id", "step")
    )
    if ids:
        Run.objects.filter(id__in=[i for i, _ in ids], status=RunStatus.WAITING_BUDGET).update(
            status=RunStatus.RUNNING, updated_at=timezone.now()
        )
    return [(str(i), int(s)) for i, s in ids]
