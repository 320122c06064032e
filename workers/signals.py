"""Worker presence: each worker process keeps a Redis key alive, for /healthz and for
the sweeper, which re-rings the doorbells of a worker whose key expired (workers/held.py)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from celery.signals import worker_ready
from django.conf import settings
from redis import RedisError

from workers.held import PRESENCE_PREFIX, WORKER_ID

log = logging.getLogger("loomcycle.worker")


def _presence_set(name: str) -> None:
    """The key lives as long as a lease: when it expires, the sweeper re-rings
    the doorbells this worker held (workers/held.py)."""
    from apps.core.redis import sync_client

    ttl = max(1, math.ceil(settings.LOOMCYCLE.lease_seconds))
    try:
        sync_client().set(PRESENCE_PREFIX + name, str(time.time()), ex=ttl)
    except (RedisError, OSError):  # retried next beat; a missed one costs duplicate doorbells at worst
        log.exception("worker presence update failed")


def _presence_loop(name: str) -> None:
    while True:
        time.sleep(settings.LOOMCYCLE.heartbeat_seconds)
        _presence_set(name)


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    _presence_set(WORKER_ID)  # before the thread: a sweep must not take this worker for dead
    threading.Thread(target=_presence_loop, args=(WORKER_ID,), name="lc-presence", daemon=True).start()
