"""Per-process registry of runs whose iteration executes here.

Two daemon threads per worker process, started on first use:
- a Redis subscriber on `lc:cancel` that sets the cancel event of a run that
  is in flight here, so cancel lands within a second on any worker;
- a heartbeat that extends the leases of every in-flight run with ONE
  fenced UPDATE every LEASE heartbeat period (not one query per run);
  the UPDATE is apps.runs.store's (`leases_extend`), the timing is here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from redis import RedisError

from apps.core.redis import sync_client
from apps.runs.store import leases_extend, pool_purge
from workers.held import WORKER_ID as WORKER_ID  # the process's lease owner id

log = logging.getLogger("loomcycle.live")

CANCEL_CHANNEL = "lc:cancel"


class _Live:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[threading.Event, int]] = {}
        self._started = False
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Before Redis goes away (shutdown of the test process): the threads end quietly."""
        self._stopping.set()

    def _ensure_threads(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._cancel_listener, name="lc-cancel", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="lc-heartbeat", daemon=True).start()

    @contextmanager
    def track(self, run_id: str) -> Iterator[threading.Event]:
        """Register before the claim so a cancel published meanwhile is not missed."""
        self._ensure_threads()
        event = threading.Event()
        with self._lock:
            self._runs[run_id] = (event, -1)
        try:
            yield event
        finally:
            with self._lock:
                self._runs.pop(run_id, None)

    def set_token(self, run_id: str, token: int) -> None:
        with self._lock:
            if run_id in self._runs:
                self._runs[run_id] = (self._runs[run_id][0], token)

    def _cancel_listener(self) -> None:
        while not self._stopping.is_set():
            try:
                pubsub = sync_client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.subscribe(CANCEL_CHANNEL)
                for message in pubsub.listen():
                    run_id = message["data"].decode()
                    with self._lock:
                        entry = self._runs.get(run_id)
                    if entry is not None:
                        entry[0].set()
            except (RedisError, OSError) as exc:  # the listener must outlive Redis restarts; log and reconnect
                if self._stopping.is_set():
                    return
                log.warning("cancel listener lost its Redis subscription (%s); reconnecting", exc)
                time.sleep(1.0)

    def _heartbeat(self) -> None:
        period = settings.LOOMCYCLE.heartbeat_seconds
        lease = settings.LOOMCYCLE.lease_seconds
        while not self._stopping.is_set():
            time.sleep(period)
            with self._lock:
                leased = [(rid, tok) for rid, (_, tok) in self._runs.items() if tok >= 0]
            if not leased:
                continue
            try:
                close_old_connections()
                # Fenced: only leases this process still holds are extended.
                leases_extend(owner=WORKER_ID, lease_seconds=lease, leased=leased)
            except DatabaseError:  # a failed beat is retried next period; the lease is long enough for one miss
                log.exception("lease heartbeat failed")
                pool_purge()  # after a Postgres restart the next beat must not take another dead connection
            finally:
                connection.close()


LIVE = _Live()


def publish_cancel(run_ids: list[str]) -> None:
    client = sync_client()
    for run_id in run_ids:
        client.publish(CANCEL_CHANNEL, run_id)
