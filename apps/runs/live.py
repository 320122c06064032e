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


class _Tracked:
    """One delivery of a run's doorbell in flight here: its cancel event and, once it
    holds the lease, its token (-1 before). Compared by identity: two deliveries of one
    run (a duplicate doorbell's no-op beside the iteration) are two entries."""

    __slots__ = ("event", "token")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.token = -1


class _Live:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Per run, every delivery in flight here: a duplicate doorbell's no-op must not
        # drop the iteration's entry (its heartbeat and its cancel) when it ends.
        self._runs: dict[str, list[_Tracked]] = {}
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
        entry = _Tracked()
        with self._lock:
            self._runs.setdefault(run_id, []).append(entry)
        try:
            yield entry.event
        finally:
            with self._lock:
                entries = self._runs.get(run_id, [])
                entries[:] = [e for e in entries if e is not entry]
                if not entries:
                    self._runs.pop(run_id, None)

    def set_token(self, run_id: str, token: int, event: threading.Event) -> None:
        """The lease token of the delivery `track` gave `event` (it claimed or adopted the run)."""
        with self._lock:
            for entry in self._runs.get(run_id, []):
                if entry.event is event:
                    entry.token = token

    def _cancel_listener(self) -> None:
        while not self._stopping.is_set():
            try:
                pubsub = sync_client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.subscribe(CANCEL_CHANNEL)
                for message in pubsub.listen():
                    run_id = message["data"].decode()
                    with self._lock:
                        events = [entry.event for entry in self._runs.get(run_id, [])]
                    for event in events:
                        event.set()
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
                leased = [(rid, e.token) for rid, entries in self._runs.items() for e in entries if e.token >= 0]
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
