"""Per-tenant limits on what the runtime writes for a tenant (issue 33): how many
definition names of one kind a tenant may hold, how often its ScheduleDefs may
fire, how many children at once its agents may ask for. The operator's yaml is
exempt: these guard the write paths (REST, MCP, agents' def tools), never
`def_sync_static`.

- A name counts while it has a version that is not retired (retiring every
  version of a name gives its place back; versions are never deleted). A new
  name past LOOMCYCLE_TENANT_MAX_DEFINITIONS (ScheduleDef: also
  LOOMCYCLE_TENANT_MAX_SCHEDULES) is apps.core.quotas' TenantQuotaExceeded, as for
  channels and volumes: 429 `tenant_quota_exceeded`, `details: {resource, tenant_id, cap}`.
  New versions of a name the tenant already holds are not counted.
- A ScheduleDef whose cron (or any `user_tier_schedules` entry) may fire twice
  within LOOMCYCLE_TENANT_SCHEDULE_MIN_PERIOD_SECONDS is refused: 422
  `schedule_too_frequent`.
- An AgentDef whose `max_concurrent_children` is above
  LOOMCYCLE_MAX_CONCURRENT_CHILDREN_CAP is refused: 422
  `max_concurrent_children_over_cap` (a yaml agent's is cut to the cap when it
  runs: apps.runs.children.fanout.max_concurrent_children).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import CroniterBadDateError, croniter
from django.conf import settings

from apps.core.quotas import tenant_count_check, tenant_count_lock
from apps.substrate.kinds import Kind, Refused
from apps.substrate.kinds.schedule import cron_fields

_WALK_FROM = datetime(2026, 1, 1, tzinfo=UTC)  # any fixed start: a cron's pattern repeats within a year
_WALK_FIRES = 2000  # consecutive fires compared, at most
_WALK_SPAN = timedelta(days=366)


def name_cap(kind: Kind) -> int:
    conf = settings.LOOMCYCLE
    if kind.key == "schedule":
        return min(conf.tenant_max_definitions, conf.tenant_max_schedules)
    return int(conf.tenant_max_definitions)


def check_new_name(kind: Kind, tenant_id: str) -> None:
    """Inside the write's transaction, before a tenant's first version of a name is
    inserted: refuse past the kind's cap. A tenant-wide lock (per kind) makes the count
    exact under concurrent creates of different names."""
    resource = f"{kind.tool} names"
    tenant_count_lock(resource, tenant_id)  # the count and the insert are one decision
    held = kind.model._default_manager.filter(tenant_id=tenant_id, retired=False).values("name").distinct().count()
    tenant_count_check(
        resource=resource,
        tenant_id=tenant_id,
        held=held,
        cap=name_cap(kind),
        setting="LOOMCYCLE_TENANT_MAX_SCHEDULES" if kind.key == "schedule" else "LOOMCYCLE_TENANT_MAX_DEFINITIONS",
        remedy="retire every version of one to free its place",
    )


def check_definition(kind: Kind, definition: dict[str, Any]) -> None:
    """The runtime-written definition's limits (not the yaml's): see the module docstring."""
    if kind.key == "agent":
        _check_children(definition)
    elif kind.key == "schedule":
        _check_period(definition)


def _check_children(definition: dict[str, Any]) -> None:
    cap = settings.LOOMCYCLE.max_concurrent_children_cap
    wanted = definition.get("max_concurrent_children")
    if isinstance(wanted, int) and wanted > cap:
        raise Refused(
            f"max_concurrent_children {wanted} is above this runtime's cap ({cap}, "
            "LOOMCYCLE_MAX_CONCURRENT_CHILDREN_CAP)",
            code="max_concurrent_children_over_cap",
        )


def _check_period(definition: dict[str, Any]) -> None:
    minimum = settings.LOOMCYCLE.tenant_schedule_min_period_seconds
    if minimum <= 60:  # a cron fires at most once a minute: nothing to check
        return
    crons = [definition.get("schedule"), *(definition.get("user_tier_schedules") or {}).values()]
    for expr in (c for c in crons if isinstance(c, str) and c.strip()):
        gap = shortest_gap(expr, minimum)
        if gap < minimum:
            raise Refused(
                f"schedule {expr!r} fires {gap} s apart; a tenant's schedule may fire at most every {minimum} s "
                "(LOOMCYCLE_TENANT_SCHEDULE_MIN_PERIOD_SECONDS)",
                code="schedule_too_frequent",
            )


def shortest_gap(expr: str, stop_below: int) -> int:
    """The fewest seconds between two consecutive fires of `expr` (in UTC), over its
    next 2,000 fires or a year, whichever ends first; stops at the first gap below
    `stop_below`. A cron is a product of its fields, so its shortest gaps appear within
    its first days (and a day-of-month pair within its first year)."""
    walker = croniter(" ".join(cron_fields(expr)), _WALK_FROM)
    shortest = int(_WALK_SPAN.total_seconds())
    try:
        previous: datetime = walker.get_next(datetime)
        for _ in range(_WALK_FIRES):
            current: datetime = walker.get_next(datetime)
            shortest = min(shortest, int((current - previous).total_seconds()))
            if shortest < stop_below or current - _WALK_FROM > _WALK_SPAN:
                break
            previous = current
    except CroniterBadDateError:  # a cron that (almost) never fires: the gaps seen so far are all it has
        return shortest
    return shortest
