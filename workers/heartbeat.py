"""Beat's liveness: the scheduler touches a file from its own tick loop, so a
container healthcheck (`python -m loomcycle_project.healthcheck beat`) can tell
a beat that still sends its periodic tasks from one that is stuck or gone.

Celery's PersistentScheduler, with one addition: after each `tick`, the file
`settings.LOOMCYCLE.beat_heartbeat_file` gets a fresh modification time when the
last one is a heartbeat period old (`LOOMCYCLE_HEARTBEAT_SECONDS`), and the loop
never sleeps longer than that period, so a live beat's file is never older than
about one period. Chosen by the CELERY_BEAT_SCHEDULER setting, so every beat
(`manage.py up`, compose, tests) runs it. The file is local to the process's
machine or container; it says nothing about another beat.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings

log = logging.getLogger("loomcycle.beat")


def touch(path: Path) -> None:
    """A fresh modification time on `path`, creating it (and its folder) when
    absent. An OSError is logged: the next period retries, and the healthcheck
    reports the file as stale meanwhile."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        log.warning("beat heartbeat file %s not updated: %s", path, exc)


class HeartbeatScheduler(PersistentScheduler):
    """PersistentScheduler whose tick loop also keeps the heartbeat file fresh."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._beat_at = -math.inf  # monotonic time of the last touch: the first tick touches
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval: float = super().tick(*args, **kwargs)
        period = settings.LOOMCYCLE.heartbeat_seconds
        now = time.monotonic()
        if now - self._beat_at >= period:
            self._beat_at = now
            touch(Path(settings.LOOMCYCLE.beat_heartbeat_file))
        return min(interval, period)  # wake at least once a period, whatever the schedule
