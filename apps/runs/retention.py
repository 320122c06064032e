"""The runs side of retention and erasure: which ended trees are due, read through the partial
indexes on ended top-level runs (`run_retention_age`, `run_retention_agent`,
`run_no_trace_ended`; apps/runs/models.py), so no read here scans the runs table. Bounded
reads only (`limit`), ordered by (completed_at, id) with a keyset cursor so a pass moves on
past a tree it could not delete (a live descendant)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from apps.runs.models import TERMINAL, Run, RunWebhook, RunWebhookDelivery
from apps.runs.statuses import NO_TRACE
from apps.runs.store import deletion as store

Cursor = tuple[datetime, str] | None  # the last (completed_at, id) read


@dataclass(frozen=True)
class RootRef:
    id: str
    tenant_id: str
    agent_name: str


def _ended_roots() -> QuerySet[Run]:
    # The same predicate as the partial indexes', so the planner can use them.
    return Run.objects.filter(parent__isnull=True, status__in=list(TERMINAL))


def _page(qs: QuerySet[Run], after: Cursor, limit: int) -> list[tuple[str, datetime]]:
    if after is not None:
        at, run_id = after
        qs = qs.filter(Q(completed_at__gt=at) | Q(completed_at=at, id__gt=run_id))
    rows = qs.order_by("completed_at", "id").values_list("id", "completed_at")[:limit]
    return [(run_id, at) for run_id, at in rows if at is not None]  # ended runs: completed_at is set


def expired_roots(
    *,
    before: datetime,
    tenant_id: str | None = None,
    agent_name: str | None = None,
    skip_tenants: Iterable[str] = (),
    skip_agents: Iterable[tuple[str, str]] = (),
    after: Cursor = None,
    limit: int,
) -> list[tuple[str, datetime]]:
    """Ended top-level runs that ended before `before`: of one tenant (and agent) when given,
    without the tenants and (tenant, agent) pairs that have a policy of their own."""
    qs = _ended_roots().filter(completed_at__lt=before)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if agent_name is not None:
        qs = qs.filter(agent_name=agent_name)
    skip_tenants = list(skip_tenants)
    if skip_tenants:
        qs = qs.exclude(tenant_id__in=skip_tenants)
    for tenant, agent in skip_agents:
        qs = qs.exclude(tenant_id=tenant, agent_name=agent)
    return _page(qs, after, limit)


def no_trace_ended(*, after: Cursor = None, limit: int) -> list[tuple[str, datetime]]:
    """Ended no-trace trees still stored (their end's delete was lost, or is overridden)."""
    return _page(_ended_roots().filter(retention=NO_TRACE), after, limit)


def no_trace_root(*, run_id: str) -> RootRef | None:
    """The run when it is an ended, top-level, no-trace run."""
    row = _ended_roots().filter(id=run_id, retention=NO_TRACE).values_list("id", "tenant_id", "agent_name").first()
    return RootRef(*row) if row else None


def retention_clear(*, run_id: str) -> None:
    """A no-trace run kept under an override: from now on the tenant's retention age applies."""
    store.retention_clear(run_id=run_id)


def user_roots(*, tenant_id: str, user_id: str, limit: int) -> list[str]:
    """A person's top-level runs, any status (index `run_user_status`, led by tenant and user)."""
    qs = Run.objects.filter(tenant_id=tenant_id, user_id=user_id, parent__isnull=True)
    return list(qs.order_by().values_list("id", flat=True)[:limit])


def user_runs_count(*, tenant_id: str, user_id: str) -> dict[str, int]:
    """A person's runs, the sessions they make up, and their runs' completion webhooks and
    deliveries (an erasure's report; the deletion of the runs removes those with them). The
    webhook rows are read through their run (index run_user_status, then the run_id indexes)."""
    qs = Run.objects.filter(tenant_id=tenant_id, user_id=user_id)
    of_runs = {"run__tenant_id": tenant_id, "run__user_id": user_id}
    return {
        "runs.Run": qs.count(),
        "runs.Session": qs.filter(parent__isnull=True).values("session_id").distinct().count(),
        "runs.RunWebhook": RunWebhook.objects.filter(**of_runs).count(),
        "runs.RunWebhookDelivery": RunWebhookDelivery.objects.filter(**of_runs).count(),
    }


def user_run_ids(*, tenant_id: str, user_id: str, limit: int) -> list[str]:
    """Up to `limit` of a person's run ids (any depth): what other planes are counted against."""
    qs = Run.objects.filter(tenant_id=tenant_id, user_id=user_id).order_by()
    return list(qs.values_list("id", flat=True)[:limit])


def live_roots_of_user(*, tenant_id: str, user_id: str, limit: int) -> list[str]:
    qs = Run.objects.filter(tenant_id=tenant_id, user_id=user_id, parent__isnull=True).exclude(status__in=TERMINAL)
    return list(qs.order_by().values_list("id", flat=True)[:limit])
