"""REST long-poll (`wait_ms`) over the channel doorbells.

The reader subscribes to the channels' doorbells (`streams.bell`) BEFORE its
first read, then re-reads on every ring and at least every second (a
deferred message becomes visible without a ring) until it is satisfied or
the wait is over; a timeout is not an error. Doorbells are released however
the request ends (a client hang-up cancels the waiting task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from apps.core.pubsub import hub

REPOLL_S = 1.0
Attempt = Callable[[bool], Awaitable[tuple[bool, dict[str, Any]]]]


async def long_poll(bells: list[str], wait_ms: int, attempt: Attempt) -> dict[str, Any]:
    """`attempt(final)` until it is satisfied or the wait is over (its last call
    gets final=True); returns what the last attempt answered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    bus = hub()
    queues: list[tuple[str, asyncio.Queue[str]]] = []
    try:
        if wait_ms > 0:
            for name in dict.fromkeys(bells):
                queues.append((name, await bus.subscribe(name)))
        while True:
            final = loop.time() >= deadline
            satisfied, out = await attempt(final)
            if satisfied or final:
                return out
            await _ring(queues, min(deadline - loop.time(), REPOLL_S))
    finally:
        for name, queue in queues:
            await bus.unsubscribe(name, queue)


async def _ring(queues: list[tuple[str, asyncio.Queue[str]]], timeout: float) -> None:
    """Wait for any doorbell (or the timeout), then empty every queue: the
    next attempt re-reads Postgres, so one ring per wait is enough."""
    if timeout > 0 and not queues:
        await asyncio.sleep(timeout)
    elif timeout > 0:
        getters = [asyncio.ensure_future(queue.get()) for _, queue in queues]
        try:
            await asyncio.wait(getters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for getter in getters:
                getter.cancel()
    for _, queue in queues:
        while not queue.empty():
            queue.get_nowait()
