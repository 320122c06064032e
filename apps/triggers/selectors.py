"""Reads of schedule state and fire history. The tenant is always explicit:
`tenant_id` None reads every tenant (admins), else only that tenant's rows;
another tenant's schedule is simply not found."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.core.errors import NotFound
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.substrate.selectors import active_defs
from apps.triggers.models import ScheduleFire, ScheduleState


def schedule_def_get(*, tenant_id: str | None, def_id: str) -> ScheduleDef:
    row = ScheduleDef.objects.filter(id=def_id).first()
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound(f"schedule {def_id!r} not found", code="not_found")
    return row


def schedule_state_find(*, def_id: str) -> ScheduleState | None:
    return ScheduleState.objects.filter(schedule_def_id=def_id).first()


def schedules_active(*, tenant_id: str | None) -> list[tuple[ScheduleDef, ScheduleState | None]]:
    """Every active, unretired schedule version of the tenant(s), with its state (None: not seeded yet)."""
    rows = list(active_defs(get_kind("schedule"), tenant_id=tenant_id).order_by("tenant_id", "name"))
    states = {s.schedule_def_id: s for s in ScheduleState.objects.filter(schedule_def_id__in=[r.id for r in rows])}
    return [(r, states.get(r.id)) for r in rows if isinstance(r, ScheduleDef)]


def schedule_fires(*, def_id: str, limit: int = 50) -> QuerySet[ScheduleFire]:
    """The newest fires of one schedule version, newest first."""
    return ScheduleFire.objects.filter(schedule_def_id=def_id).order_by("-fire_time")[:limit]


def schedule_fire_for_run(*, run_id: str) -> ScheduleFire | None:
    return ScheduleFire.objects.filter(run_id=run_id).first()
