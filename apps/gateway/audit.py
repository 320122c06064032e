"""The audit writer: gateway calls are stored off the request path, in batches.

A finished call is appended to an in-memory queue (no I/O, no await on the
event loop); one writer thread per process stores what has queued every
FLUSH_INTERVAL_S (or sooner, once BATCH rows wait) with `gateway_calls_save`.
Nothing is dropped silently:
- a database error keeps the batch and retries with backoff (up to 30 s);
- past MAX_PENDING queued rows the oldest are dropped, each logged at ERROR
  with its full content (the log is the audit of last resort);
- at interpreter exit the queue is flushed once more; what cannot be stored
  then is logged the same way.
A process killed outright (SIGKILL, OOM) loses at most the rows of the last
interval, which is the price of keeping the database off the hot path.
Every record is redacted as it is queued (`redacted`), before the row or a
log line can be built from it.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import threading
import time
from dataclasses import replace

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from apps.core.redact import runtime_redactor
from apps.gateway.services import CallRecord, gateway_calls_save

log = logging.getLogger("loomcycle.gateway.audit")

FLUSH_INTERVAL_S = 0.2
BATCH = 500
MAX_PENDING = 100_000
MAX_BACKOFF_S = 30.0


class AuditWriter:
    def __init__(self) -> None:
        self._queue: collections.deque[CallRecord] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._registered = False
        self.stored = 0
        self.dropped = 0

    def record(self, record: CallRecord) -> None:
        """Queue one finished call (thread-safe, O(1), never blocks), redacted:
        what is stored, and what a lost row's log line shows, never holds a secret."""
        self._queue.append(redacted(record))
        if len(self._queue) > MAX_PENDING:
            self._drop(self._queue.popleft(), "audit queue full")
        if len(self._queue) >= BATCH:
            self._wake.set()
        if self._thread is None or not self._thread.is_alive():
            self._start()

    def pending(self) -> int:
        return len(self._queue)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gateway-audit", daemon=True)
            self._thread.start()
            if not self._registered:
                self._registered = True
                atexit.register(self.close)

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            self._wake.wait(backoff or FLUSH_INTERVAL_S)
            self._wake.clear()
            try:
                self.flush()
                backoff = 0.0
            except DatabaseError as exc:  # kept queued; retried after the backoff
                backoff = min(MAX_BACKOFF_S, max(1.0, backoff * 2))
                log.error("gateway audit: storing %d rows failed (retry in %.0f s): %s", self.pending(), backoff, exc)

    def flush(self) -> int:
        """Store everything queued now; on a database error the unstored rows stay queued."""
        stored = 0
        try:
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                try:
                    stored += gateway_calls_save(records=batch)
                except (OperationalError, InterfaceError):  # transient: the database is away
                    self._queue.extendleft(reversed(batch))
                    raise
                except DatabaseError as exc:  # a row the database refuses must not block the rest
                    log.error("gateway audit: batch refused (%s); storing its rows one by one", exc)
                    stored += self._one_by_one(batch)
        finally:
            self.stored += stored
            connection.close()  # the pool gets it back between batches
        return stored

    def _one_by_one(self, batch: list[CallRecord]) -> int:
        stored = 0
        for i, record in enumerate(batch):
            try:
                stored += gateway_calls_save(records=[record])
            except (OperationalError, InterfaceError):
                self._queue.extendleft(reversed(batch[i:]))
                raise
            except DatabaseError as exc:
                self._drop(record, f"refused by the database: {exc}")
        return stored

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and store what is left; log what still cannot be stored."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            try:
                self.flush()
            except DatabaseError as exc:
                log.error("gateway audit: final flush failed: %s", exc)
                break
        while self._queue:
            self._drop(self._queue.popleft(), "not stored at shutdown")

    def _drop(self, record: CallRecord, why: str) -> None:
        self.dropped += 1
        log.error("gateway audit row lost (%s): %s", why, json.dumps(record.as_dict(), default=str))


def redacted(record: CallRecord) -> CallRecord:
    """`record` with its caller-supplied text redacted (apps.core.redact): the
    audit row is built from these fields only."""
    redactor = runtime_redactor()
    return replace(
        record,
        user_id=redactor.text(record.user_id),
        subject=redactor.text(record.subject),
        model=redactor.text(record.model),
        error_code=redactor.text(record.error_code),
    )


WRITER = AuditWriter()
