"""Each process's copy of the hook registrations, invalidated cluster-wide.

The chains run on every tool call, so the registrations are kept in memory.
Every write (register, replace, delete) bumps a Redis counter after it
commits (`bump`, as operator tokens do in apps.substrate.auth_cache); a
process compares the counter with the one its copy was loaded under at each
tool call that may be hooked, and reloads on a difference. So a registration
made in a web process is seen by every worker's next tool call, without a
restart and without a fixed propagation delay. The counter is read BEFORE the
reload, so a write committing during it leaves the copy stale, never wrong.
If Redis cannot be read, the database is read every time (never a copy that
might be stale); a copy is also never older than MAX_AGE_S, which bounds a
bump that could not reach Redis. The connection a reload used is handed back before the
caller goes on to make HTTP calls.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection
from redis import RedisError

from apps.core.redis import sync_client
from apps.triggers.hooks import selectors
from apps.triggers.hooks.types import Hook

log = logging.getLogger("loomcycle.hooks")

EPOCH_KEY = "lc:hooks:epoch"
MAX_AGE_S = 30.0

_lock = threading.Lock()
_copy: tuple[int, float, tuple[Hook, ...]] | None = None  # (epoch it was loaded under, monotonic at load, hooks)


def _epoch() -> int | None:
    try:
        raw = sync_client().get(EPOCH_KEY)
        return int(raw) if raw is not None else 0
    except (RedisError, ValueError) as exc:
        log.warning("hook registry: cannot read %s, reading the database instead: %s", EPOCH_KEY, exc)
        return None


def _load() -> tuple[Hook, ...]:
    try:
        return selectors.hooks_all()
    finally:
        if not connection.in_atomic_block:
            connection.close()  # no connection is kept across the callbacks that follow


def hooks() -> tuple[Hook, ...]:
    """Every registration in chain order, current as of this call's counter read."""
    global _copy
    epoch = _epoch()
    current, now = _copy, time.monotonic()
    if epoch is not None and current is not None and current[0] == epoch and now - current[1] < MAX_AGE_S:
        return current[2]
    loaded = _load()
    if epoch is not None:
        with _lock:
            _copy = (epoch, now, loaded)
    return loaded


def forget_local() -> None:
    global _copy
    with _lock:
        _copy = None


def bump() -> None:
    """After a registration write commits: every process reloads at its next tool call."""
    forget_local()
    try:
        sync_client().incr(EPOCH_KEY)
    except RedisError as exc:  # other processes keep their copy until Redis is back: say so loudly
        log.error("hook registry: cannot bump %s after a registration write: %s", EPOCH_KEY, exc)
