"""Fire times of a ScheduleDef: standard 5-field cron in an IANA time zone,
evaluated with croniter. A time skipped by a spring-forward fires at the
first minute after the gap (croniter's rule); a wall-clock time repeated by a
fall-back fires once (the first occurrence) when the hour field is fixed, at
both occurrences when it is `*`.

All times in and out are aware datetimes; results are in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from apps.substrate.kinds.schedule import cron_fields

_JUST_AFTER = timedelta(microseconds=1)  # croniter's get_prev is strictly before its start


def cron_of(definition: dict[str, Any]) -> str:
    """The definition's cron: `schedule`, else its user tier's `user_tier_schedules` entry."""
    if definition.get("schedule"):
        return str(definition["schedule"])
    tiers = definition.get("user_tier_schedules") or {}
    return str(tiers[definition.get("user_tier") or "default"])


def _iter(expr: str, tz: str, start: datetime) -> croniter:
    return croniter(" ".join(cron_fields(expr)), start.astimezone(ZoneInfo(tz or "UTC")))


def _repeats_skipped(expr: str) -> bool:
    """A cron with a fixed hour fires once on a DST fall-back day (the first of
    the repeated wall-clock times, as cron does); `*` hours fire in both."""
    return cron_fields(expr)[1] != "*"


def _is_repeat(slot: datetime, tz: str) -> bool:
    """`slot` (UTC) is the second occurrence of its local wall-clock time (fold=1)."""
    return slot.astimezone(ZoneInfo(tz or "UTC")).fold == 1


def _step(walker: croniter, forward: bool, skip_repeats: bool, tz: str) -> datetime | None:
    """The walker's next (or previous) slot in UTC, repeats skipped as asked; None when there is none."""
    while True:
        try:
            found: datetime = (walker.get_next if forward else walker.get_prev)(datetime)
        except CroniterBadDateError:
            return None
        slot = found.astimezone(UTC)
        if not (skip_repeats and _is_repeat(slot, tz)):
            return slot


def next_after(expr: str, tz: str, moment: datetime) -> datetime | None:
    """The first slot strictly after `moment`; None when the cron never fires again."""
    return _step(_iter(expr, tz, moment), True, _repeats_skipped(expr), tz)


DROPPED_COUNT_CAP = 100  # dropped slots are counted up to this (a log line's "at least N"), never walked further


def due_slots(
    expr: str, tz: str, *, first: datetime, now: datetime, keep: int, protect_after: datetime | None = None
) -> tuple[list[datetime], int]:
    """The slots to fire now, oldest first, and how many older due slots are
    dropped (counted up to DROPPED_COUNT_CAP). Due slots are `first` (the
    state's next_run_at: a cron slot, or a run-now moment) and every cron slot
    after it up to `now`. Every due slot after `protect_after` fires (slots a
    late tick finds: the previous tick ran then); of the older ones at most
    enough to make `keep` in all. Walks back from `now`, so a long outage
    costs `keep` steps plus the count cap, not one per missed slot."""
    if first > now:
        return [], 0
    skip = _repeats_skipped(expr)
    newest: list[datetime] = []
    walker = _iter(expr, tz, now + _JUST_AFTER)
    dropped = 0
    while dropped < DROPPED_COUNT_CAP:
        slot = _step(walker, False, skip, tz)
        if slot is None or slot < first:
            break
        if len(newest) < keep or (protect_after is not None and slot > protect_after):
            newest.append(slot)
        else:
            dropped += 1
    if first not in newest and len(newest) < keep and dropped == 0:
        newest.append(first)  # a run-now moment, or the oldest slot itself
    return sorted(newest), dropped
