"""Worker presence for /healthz: each worker process keeps a Redis key alive."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready
from redis import RedisError

log = logging.getLogger("loomcycle.worker")

PRESENCE_PREFIX = "lc:worker:"
PRESENCE_TTL_S = 30


def _presence_loop(name: str) -> None:
    from apps.core.redis import sync_client

    while True:
        try:
            sync_client().set(PRESENCE_PREFIX + name, str(time.time()), ex=PRESENCE_TTL_S)
        except (RedisError, OSError):  # presence is advisory; retry next beat
            log.exception("worker presence update failed")
        time.sleep(PRESENCE_TTL_S / 3)


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    from apps.runs.live import WORKER_ID

    threading.Thread(target=_presence_loop, args=(WORKER_ID,), name="lc-presence", daemon=True).start()
