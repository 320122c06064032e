"""A limit's windows: where the one containing an instant starts and ends (UTC). A rolling
limit (window=hours) has one window row for ever, keyed at the epoch (apps.budgets.rolling)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apps.budgets.models import Window

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def window_start(window: str, hours: int, now: datetime) -> datetime:
    now = now.astimezone(UTC)
    if window == Window.MONTH:
        return datetime(now.year, now.month, 1, tzinfo=UTC)
    if window == Window.DAY:
        return datetime(now.year, now.month, now.day, tzinfo=UTC)
    return _EPOCH


def window_end(window: str, hours: int, start: datetime) -> datetime:
    """The next calendar window's start: when a deferred run wakes (rolling: apps.budgets.rolling)."""
    if window == Window.MONTH:
        return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
    return start + timedelta(days=1)


def window_label(window: str, hours: int) -> str:
    return f"{hours}h" if window == Window.HOURS else window
