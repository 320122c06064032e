"""Worker presence: each worker process keeps a Redis key alive, for /healthz and for
the sweeper, which re-rings the doorbells of a worker whose key expired (workers/held.py).
Each worker process (and beat) also makes itself non-dumpable (loomcycle_project.hardening).

Plumbing only: what the project and the apps do in a worker's life (tracing set-up,
loomcycle_project.telemetry; stopping the MCP sessions at shutdown, apps.mcp) they connect
to Celery's signals themselves, from their AppConfig.ready(), which Celery's Django fixup
runs before it sends any of them."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from celery.signals import beat_init, worker_init, worker_process_init, worker_ready
from django.conf import settings
from redis import RedisError

from loomcycle_project.hardening import not_dumpable
from workers.held import PRESENCE_PREFIX, WORKER_ID, presence_value

log = logging.getLogger("loomcycle.worker")


def _presence_set(name: str) -> None:
    """The key lives as long as a lease: when it expires, the sweeper re-rings
    the doorbells this worker held (workers/held.py). Its value is the worker's
    `replicas[]` entry in /healthz (`presence_value`)."""
    from apps.core.redis import sync_client

    ttl = max(1, math.ceil(settings.LOOMCYCLE.lease_seconds))
    version = settings.LOOMCYCLE.worker_version  # old and new side by side during a rolling deploy
    try:
        sync_client().set(
            PRESENCE_PREFIX + name, presence_value(kind="worker", process_id=name, version=version), ex=ttl
        )
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


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    not_dumpable()  # the main process: the threads pool runs tools here


@worker_process_init.connect
def _on_worker_process_init(sender: Any = None, **_: Any) -> None:
    not_dumpable()  # a prefork child (inherited already; set again in case a pool re-execs)


@beat_init.connect
def _on_beat_init(sender: Any = None, **_: Any) -> None:
    not_dumpable()  # workers.celery did already; kept with the worker's for one place to read
