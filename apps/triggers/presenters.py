"""Wire shapes of the schedules admin routes (SPEC 2.6)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.core.timefmt import ts
from apps.substrate.models import ScheduleDef
from apps.triggers.models import ScheduleFire, ScheduleState


def _t(value: datetime | None) -> str | None:
    return ts(value) if value is not None else None


def state_out(row: ScheduleDef, state: ScheduleState | None, next_run_at: datetime | None) -> dict[str, Any]:
    """`GET /v1/_schedules/{def_id}/state`; `next_run_at` is the state's, or the computed one before seeding."""
    return {
        "def_id": row.id,
        "name": row.name,
        "tenant_id": row.tenant_id,
        "last_run_at": _t(state.last_run_at) if state else None,
        "last_run_id": state.last_run_id if state else "",
        "last_status": state.last_status if state else "",
        "last_error": state.last_error if state else "",
        "next_run_at": _t(next_run_at),
        "paused_until": _t(state.paused_until) if state else None,
        "fire_count": state.fire_count if state else 0,
    }


def entry_out(row: ScheduleDef, state: ScheduleState | None, next_run_at: datetime | None) -> dict[str, Any]:
    """One `list-all` entry: the state plus what the definition says."""
    d = row.definition
    return {
        **state_out(row, state, next_run_at),
        "version": row.version,
        "agent": d.get("agent", ""),
        "schedule": d.get("schedule", ""),
        "user_tier_schedules": d.get("user_tier_schedules"),
        "timezone": d.get("timezone", "UTC"),
        "enabled": d.get("enabled", True) is not False,
        "max_fires": int(d.get("max_fires") or 0),
        "catch_up_max": int(d.get("catch_up_max") or 0),
    }


def fire_out(fire: ScheduleFire) -> dict[str, Any]:
    return {
        "fire_time": ts(fire.fire_time),
        "fired_at": ts(fire.fired_at),
        "outcome": fire.outcome,
        "counted": fire.counted,
        "run_id": fire.run_id,
        "run_status": fire.run_status,
        "error": fire.error,
        "hook_results": fire.hook_results,
    }
