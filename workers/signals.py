"""Worker presence: each worker process keeps a Redis key alive, for /healthz and for
the sweeper, which re-rings the doorbells of a worker whose key expired (workers/held.py).
Each worker process also makes itself non-dumpable (loomcycle_project.hardening), and stops the MCP
sessions it opened (stdio server processes included) when it shuts down.
Tracing is set up here too (loomcycle_project.telemetry): in the process that runs tasks,
which is each prefork child (`worker_process_init`, as the Celery instrumentation asks) or
the worker itself for the threads and solo pools, which send no such signal per child; and in beat."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from celery import concurrency
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import (
    beat_init,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.conf import settings
from redis import RedisError

from loomcycle_project import telemetry
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
    if not issubclass(concurrency.get_implementation(getattr(sender, "pool_cls", "prefork")), PreforkPool):
        telemetry.setup("worker")  # threads/solo: tasks run in this process (prefork: in each child, below)


@worker_process_init.connect
def _on_worker_process_init(sender: Any = None, **_: Any) -> None:
    not_dumpable()  # a prefork child (inherited already; set again in case a pool re-execs)
    telemetry.setup("worker")  # once per process: the solo pool sends this after worker_init


@beat_init.connect
def _on_beat_init(sender: Any = None, **_: Any) -> None:
    not_dumpable()  # workers.celery did already; kept with the worker's for one place to read
    telemetry.setup("beat")


@worker_shutdown.connect
@worker_process_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    """Stop this process's MCP sessions: its stdio servers exit with it, not after it."""
    from apps.mcp.client.calls import shutdown

    shutdown()
