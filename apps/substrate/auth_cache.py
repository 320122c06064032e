"""Per-process cache of bearer lookups (loomcycle's LOOMCYCLE_AUTH_CACHE_TTL_SECONDS).

A token that authenticated is remembered by its digest for the TTL (never
past its own `retired_at`), so the hot path does no database round trip and
no thread hop. Revocation still lands cluster-wide within about a second:
every token write (create, rotate, retire) bumps a Redis counter after its
commit, and an entry filled under an older counter value is ignored. The
counter is read at most once per LOOMCYCLE_AUTH_EPOCH_CHECK_MS per process; if Redis cannot
be read the cache is bypassed (the database decides), never trusted blindly.
Failed lookups are not cached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from redis import RedisError

from apps.core.redis import sync_client
from apps.core.types import Principal

log = logging.getLogger("loomcycle.auth")

EPOCH_KEY = "lc:auth:epoch"
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires: float  # monotonic
    epoch: int


_lock = threading.Lock()
_entries: dict[str, _Entry] = {}
_epoch: tuple[float, int | None] = (0.0, None)  # (checked at, value; None = unreadable)


def _current_epoch() -> int | None:
    global _epoch
    now = time.monotonic()
    checked, value = _epoch
    if now - checked < settings.LOOMCYCLE.auth_epoch_check_ms / 1000.0:
        return value
    try:
        raw = sync_client().get(EPOCH_KEY)
        value = int(raw) if raw is not None else 0
    except (RedisError, ValueError) as exc:
        log.warning("auth cache bypassed: cannot read %s: %s", EPOCH_KEY, exc)
        value = None
    _epoch = (now, value)
    return value


def lookup(digest: str) -> Principal | None:
    """The cached principal of a token digest, or None (look it up)."""
    if settings.LOOMCYCLE.auth_cache_ttl_seconds <= 0:
        return None
    entry = _entries.get(digest)
    if entry is None or entry.expires <= time.monotonic():
        return None
    epoch = _current_epoch()
    if epoch is None or epoch != entry.epoch:
        return None
    return entry.principal


def snapshot() -> int | None:
    """The counter as of now, taken BEFORE the database lookup whose result is
    remembered: a write that commits in between then makes the entry stale."""
    if settings.LOOMCYCLE.auth_cache_ttl_seconds <= 0:
        return None
    return _current_epoch()


def remember(digest: str, principal: Principal, retired_at: datetime | None, epoch: int | None) -> None:
    if settings.LOOMCYCLE.auth_cache_ttl_seconds <= 0 or epoch is None:
        return
    ttl = float(settings.LOOMCYCLE.auth_cache_ttl_seconds)
    if retired_at is not None:  # inside a rotation grace: never past the end of it
        ttl = min(ttl, retired_at.timestamp() - time.time())
    if ttl <= 0:
        return
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[digest] = _Entry(principal, time.monotonic() + ttl, epoch)


def current_epoch() -> int | None:
    """The counter (read at most once per AUTH_EPOCH_CHECK_MS); None when Redis is unreadable."""
    return _current_epoch()


def forget_local() -> None:
    """This process drops its cached lookups at once (at a token write, even before it commits)."""
    global _epoch
    with _lock:
        _entries.clear()
    _epoch = (0.0, None)
    _local_listeners_fire()


_listeners: list[Callable[[], None]] = []


def on_forget(listener: Callable[[], None]) -> None:
    """Other per-process caches derived from the token table (open mode) register here."""
    _listeners.append(listener)


def _local_listeners_fire() -> None:
    for listener in _listeners:
        listener()


def bump() -> None:
    """After a token write commits: every process drops what it cached."""
    forget_local()
    try:
        sync_client().incr(EPOCH_KEY)
    except RedisError as exc:  # the TTL still bounds how long other processes trust their entries
        log.error("auth cache: cannot bump %s after a token write: %s", EPOCH_KEY, exc)
