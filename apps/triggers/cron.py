"""Fire times of a ScheduleDef: standard 5-field cron in an IANA time zone,
evaluated with croniter (DST gaps and repeats as croniter resolves them).

All times in and out are aware datetimes; results are in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from apps.substrate.kinds_admin.schedule import cron_fields

_JUST_AFTER = timedelta(microseconds=1)  # croniter's get_prev is strictly before its start


def cron_of(definition: dict[str, Any]) -> str:
    """The definition's cron: `schedule`, else its user tier's `user_tier_schedules` entry."""
    if definition.get("schedule"):
        return str(definition["schedule"])
    tiers = definition.get("user_tier_schedules") or {}
    return str(tiers[definition.get("user_tier") or "default"])


def _iter(expr: str, tz: str, start: datetime) -> croniter:
    return croniter(" ".join(cron_fields(expr)), start.astimezone(ZoneInfo(tz or "UTC")))


def next_after(expr: str, tz: str, moment: datetime) -> datetime | None:
    """The first slot strictly after `moment`; None when the cron never fires again."""
    try:
        found: datetime = _iter(expr, tz, moment).get_next(datetime)
    except CroniterBadDateError:
        return None
    return found.astimezone(UTC)


def due_slots(expr: str, tz: str, *, first: datetime, now: datetime, keep: int) -> tuple[list[datetime], int]:
    """The slots to fire now, oldest first, and how many older due slots are
    dropped. Due slots are `first` (the state's next_run_at: a cron slot, or a
    run-now moment) and every cron slot after it up to `now`; at most the
    newest `keep` are fired. Walks back from `now`, so a long outage costs
    `keep` steps, not one per missed slot."""
    if first > now:
        return [], 0
    newest: list[datetime] = []
    walker = _iter(expr, tz, now + _JUST_AFTER)
    while len(newest) < keep:
        try:
            slot = walker.get_prev(datetime).astimezone(UTC)
        except CroniterBadDateError:
            break
        if slot < first:
            break
        newest.append(slot)
    if first not in newest and len(newest) < keep:
        newest.append(first)  # a run-now moment, or the oldest slot itself
    dropped = 0 if len(newest) < keep else _count_between(expr, tz, first, min(newest))
    return sorted(newest), dropped


def _count_between(expr: str, tz: str, first: datetime, before: datetime, cap: int = 10_000) -> int:
    """Due slots in [first, before) (capped): the ones a catch-up limit drops."""
    count = 0
    walker = _iter(expr, tz, first - _JUST_AFTER)
    while count < cap:
        try:
            slot = walker.get_next(datetime).astimezone(UTC)
        except CroniterBadDateError:
            break
        if slot >= before:
            break
        count += 1
    return count
