"""Long-poll (`wait_ms`) over the channel doorbells, for every async transport: REST, the MCP
server and gRPC call `subscribe_waiting` (a subscribe that waits) rather than each writing
the wait around `cursors.subscribe`; the fan-in await (apps.channels.verbs.await_waiting, REST
and gRPC) calls `long_poll` itself.

The reader subscribes to the channels' doorbells (`streams.bell`) BEFORE its
first read, then re-reads on every ring and at least every second (a
deferred message becomes visible without a ring) until it is satisfied or
the wait is over; a timeout is not an error. Doorbells are released however
the request ends (a client hang-up cancels the waiting task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from apps.channels import access, cursors, selectors
from apps.channels.streams import Read, Stream, bell, check_cursor
from apps.core.http import db_call
from apps.core.pubsub import hub

REPOLL_S = 1.0
T = TypeVar("T")
Attempt = Callable[[bool], Awaitable[tuple[bool, T]]]


async def subscribe_waiting(
    *, stream: Stream, from_cursor: str | None, max_messages: int | None, wait_ms: int | None
) -> Read:
    """Read `stream` after `from_cursor` (absent: the committed cursor) and commit the cursor
    past what was read; with nothing there, wait up to `wait_ms` (cut to the operator's cap)
    for a message. Raises InvalidCursor for a bad cursor; a timeout is an empty read."""
    start = check_cursor(from_cursor)
    limit = selectors.clamp_max(max_messages)
    read = db_call(cursors.subscribe)

    async def attempt(final: bool) -> tuple[bool, Read]:
        got = await read(stream=stream, from_cursor=start, max_messages=limit)
        return bool(got.messages), got

    return await long_poll([bell(stream.tenant_id, stream.channel)], access.capped_wait_ms(wait_ms), attempt)


async def long_poll(bells: list[str], wait_ms: int, attempt: Attempt[T]) -> T:
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
