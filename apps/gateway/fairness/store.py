"""Redis plumbing of the fairness gates: the Lua scripts (each check-and-take
is atomic cluster-wide), the sync and per-event-loop async clients, and the
heartbeat that keeps held call slots alive."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from typing import Any
from weakref import WeakKeyDictionary

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

from apps.core.redis import async_client, sync_client
from apps.gateway.fairness.config import INDEX_KEY, RUNS_KEY, WAITING_KEY, FairnessUnavailable, Gate

log = logging.getLogger("loomcycle.fairness")

CALL_TTL_MS = 30_000
HEARTBEAT_S = 10.0
WAITER_TTL_MS = 5_000

_NOW = "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n"
# KEYS: the sets; ARGV: member, ttl_ms, run hash ('' = none), index set ('' = none), cap per key.
# Returns 0 (taken) or the 1-based index of the first set that is full. Retaking is a no-op.
_TAKE = (
    _NOW
    + """
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if not redis.call('ZSCORE', key, ARGV[1]) and redis.call('ZCARD', key) >= tonumber(ARGV[4 + i]) then
    return i
  end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[1])
  if ARGV[4] ~= '' then redis.call('SADD', ARGV[4], key) end
end
if ARGV[3] ~= '' then redis.call('HSET', ARGV[3], ARGV[1], now .. '\\n' .. table.concat(KEYS, '\\n')) end
return 0
"""
)
# KEYS: run hash, index set; ARGV: 'release' | 'refresh', ttl_ms, run ids. Returns how many were held.
_RUNS = (
    _NOW
    + """
local held = 0
for i = 3, #ARGV do
  local entry = redis.call('HGET', KEYS[1], ARGV[i])
  if entry then
    held = held + 1
    local first = true
    for key in string.gmatch(entry, '[^\\n]+') do
      if first then first = false
      elseif ARGV[1] == 'release' then redis.call('ZREM', key, ARGV[i])
      else redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[i]); redis.call('SADD', KEYS[2], key) end
    end
    if ARGV[1] == 'release' then redis.call('HDEL', KEYS[1], ARGV[i]) end
  end
end
return held
"""
)
# KEYS: sets; ARGV: member, ttl_ms, 'XX' (refresh only: an expired slot is never resurrected) or ''.
_TOUCH = (
    _NOW
    + """
for _, key in ipairs(KEYS) do
  if ARGV[3] == 'XX' then redis.call('ZADD', key, 'XX', now + tonumber(ARGV[2]), ARGV[1])
  else redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[1]) end
end
return 0
"""
)
# ARGV[1]: index set; KEYS: more sets to count. Returns {{key, n, ...} of the index, {n per KEYS}}.
_STATS = (
    _NOW
    + """
local held = {}
for _, key in ipairs(redis.call('SMEMBERS', ARGV[1])) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n = redis.call('ZCARD', key)
  if n == 0 then redis.call('SREM', ARGV[1], key) else held[#held + 1] = key; held[#held + 1] = n end
end
local counts = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  counts[i] = redis.call('ZCARD', key)
end
return {held, counts}
"""
)
_SOURCES = {"take": _TAKE, "runs": _RUNS, "touch": _TOUCH, "stats": _STATS}


@cache
def scripts() -> dict[str, Script]:
    client = sync_client()
    return {name: client.register_script(src) for name, src in _SOURCES.items()}


_ASYNC: WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[aioredis.Redis, dict[str, AsyncScript]]] = (
    WeakKeyDictionary()
)


def ascripts() -> tuple[aioredis.Redis, dict[str, AsyncScript]]:
    """An asyncio client per event loop (a loop must own its connections)."""
    loop = asyncio.get_running_loop()
    found = _ASYNC.get(loop)
    if found is None:
        client = async_client()
        found = (client, {name: client.register_script(src) for name, src in _SOURCES.items()})
        _ASYNC[loop] = found
    return found


def _take_args(gates: list[Gate], member: str, ttl_ms: int, *, run: bool) -> tuple[list[str], list[Any]]:
    index = INDEX_KEY if gates[0].kind in ("user", "tenant") else ""  # the run/call counters the stats list
    return [g.key for g in gates], [member, ttl_ms, RUNS_KEY if run else "", index, *(g.cap for g in gates)]


def take(gates: list[Gate], member: str, ttl_ms: int, *, run: bool = False) -> Gate | None:
    """Take a slot in every gate or in none; the first full gate, or None when taken."""
    keys, args = _take_args(gates, member, ttl_ms, run=run)
    try:
        full = int(scripts()["take"](keys=keys, args=args))
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc
    return gates[full - 1] if full else None


async def atake(gates: list[Gate], member: str, ttl_ms: int) -> Gate | None:
    keys, args = _take_args(gates, member, ttl_ms, run=False)
    try:
        full = int(await ascripts()[1]["take"](keys=keys, args=args))
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc
    return gates[full - 1] if full else None


def _unavailable(exc: redis.RedisError) -> FairnessUnavailable:
    return FairnessUnavailable(f"admission is unavailable: Redis did not answer ({exc})")


def mark_waiting(gate: Gate, waiter: str) -> None:
    """Count a caller as `queued` on a provider for WAITER_TTL_MS (re-marked every poll)."""
    try:
        scripts()["touch"](keys=[WAITING_KEY + gate.name], args=[waiter, WAITER_TTL_MS, ""])
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc


async def amark_waiting(gate: Gate, waiter: str) -> None:
    try:
        await ascripts()[1]["touch"](keys=[WAITING_KEY + gate.name], args=[waiter, WAITER_TTL_MS, ""])
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc


def unmark_waiting(gate: Gate, waiter: str) -> None:
    try:
        sync_client().zrem(WAITING_KEY + gate.name, waiter)
    except redis.RedisError as exc:  # not raised over the caller's outcome: the mark expires by itself
        log.warning("waiter %s not cleared (%s); it expires within %d ms", waiter, exc, WAITER_TTL_MS)


async def aunmark_waiting(gate: Gate, waiter: str) -> None:
    try:
        await ascripts()[0].zrem(WAITING_KEY + gate.name, waiter)
    except redis.RedisError as exc:
        log.warning("waiter %s not cleared (%s); it expires within %d ms", waiter, exc, WAITER_TTL_MS)


class _Heartbeat:
    """One daemon thread per process refreshes every held call slot (refresh
    only: a slot that expired meanwhile is never resurrected)."""

    def __init__(self) -> None:
        self._held: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._pid = 0

    def hold(self, member: str, keys: list[str]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: the parent's thread is not here
                self._pid, self._held = os.getpid(), {}
                threading.Thread(target=self._loop, name="fairness-heartbeat", daemon=True).start()
            self._held[member] = keys

    def drop(self, member: str) -> None:
        with self._lock:
            self._held.pop(member, None)

    def _loop(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                held = list(self._held.items())
            if held:
                self._refresh(held)

    def _refresh(self, held: list[tuple[str, list[str]]]) -> None:
        try:
            pipe = sync_client().pipeline(transaction=False)
            for member, keys in held:
                scripts()["touch"](keys=keys, args=[member, CALL_TTL_MS, "XX"], client=pipe)
            pipe.execute()
        except redis.RedisError as exc:  # retried next beat; slots expire only after CALL_TTL_MS
            log.warning("fairness heartbeat: could not refresh %d held slot(s): %s", len(held), exc)


HEARTBEAT = _Heartbeat()


def _release_failed(member: str, exc: redis.RedisError) -> None:
    # Not raised: it would hide the call's own outcome; unrefreshed, the slot expires in CALL_TTL_MS.
    log.warning("slot %s not released (%s); it expires within %d ms", member, exc, CALL_TTL_MS)


@contextmanager
def held(gates: list[Gate], member: str) -> Iterator[None]:
    HEARTBEAT.hold(member, [g.key for g in gates])
    try:
        yield
    finally:
        HEARTBEAT.drop(member)
        pipe = sync_client().pipeline(transaction=False)
        for gate in gates:
            pipe.zrem(gate.key, member)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            _release_failed(member, exc)


@asynccontextmanager
async def aheld(gates: list[Gate], member: str) -> AsyncIterator[None]:
    HEARTBEAT.hold(member, [g.key for g in gates])
    try:
        yield
    finally:
        await arelease(gates, member)


async def arelease(gates: list[Gate], member: str) -> None:
    """Give a slot back: stop refreshing it and remove it from every gate."""
    HEARTBEAT.drop(member)
    pipe = ascripts()[0].pipeline(transaction=False)
    for gate in gates:
        pipe.zrem(gate.key, member)
    try:
        await pipe.execute()
    except redis.RedisError as exc:
        _release_failed(member, exc)
