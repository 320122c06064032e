"""Doorbells over Redis pub/sub for async readers (SSE, WebSocket, long-poll).

One Redis connection per event loop multiplexes every open reader; a reader
subscribes to a Redis channel name and gets a small queue that is rung with
each message's data. Doorbells are at most once: readers always re-read
Postgres after a ring, and re-poll on a timer, so a lost ring costs latency,
never data.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis import RedisError

from apps.core.redis import async_client

log = logging.getLogger("loomcycle.pubsub")


class Hub:
    def __init__(self) -> None:
        self._queues: dict[str, set[asyncio.Queue[str]]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def subscribe(
        self, name: str, queue: asyncio.Queue[str] | None = None, maxsize: int = 64
    ) -> asyncio.Queue[str]:
        """A queue rung with `name`'s messages; pass `queue` to ring one queue from several names."""
        queue = queue if queue is not None else asyncio.Queue(maxsize=maxsize)
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = async_client().pubsub(ignore_subscribe_messages=True)
            if name not in self._queues:
                self._queues[name] = set()
                await self._pubsub.subscribe(name)
            self._queues[name].add(queue)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read())
        return queue

    async def unsubscribe(self, name: str, queue: asyncio.Queue[str]) -> None:
        async with self._lock:
            queues = self._queues.get(name)
            if queues is None:
                return
            queues.discard(queue)
            if not queues:
                del self._queues[name]
                await self._pubsub.unsubscribe(name)

    async def _read(self) -> None:
        while self._queues:
            try:
                msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError):  # readers re-poll Postgres, so a Redis hiccup costs latency only
                log.exception("pub/sub hub lost Redis; readers fall back to polling")
                await asyncio.sleep(1.0)
                continue
            if not msg:
                continue
            name, data = msg["channel"].decode(), msg["data"].decode()
            for queue in list(self._queues.get(name, ())):
                if not queue.full():  # a doorbell: one pending ring is enough; a live delta: a gap the reader sees
                    queue.put_nowait(data)


_HUBS: dict[int, Hub] = {}


def hub() -> Hub:
    """The hub of the running event loop."""
    loop_id = id(asyncio.get_running_loop())
    if loop_id not in _HUBS:
        _HUBS[loop_id] = Hub()
    return _HUBS[loop_id]
