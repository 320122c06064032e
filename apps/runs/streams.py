"""Gap-free run event streams for SSE and WebSocket.

Postgres is what readers read; Redis pub/sub (`lc:run:<id>`, published by the
worker after each commit) only wakes them. A reader subscribes BEFORE its
first read, reads `seq > cursor` in pages, and re-reads on every wake-up and
at least every second (a lost wake-up costs latency, never events). One Redis
connection per web process multiplexes every open stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from redis import RedisError

from apps.core.redis import async_client
from apps.runs.dispatch import run_channel
from apps.runs.models import TERMINAL
from apps.runs.selectors import run_events_since, run_status

log = logging.getLogger("loomcycle.streams")

PAGE = 500
REPOLL_S = 1.0


@dataclass(frozen=True)
class Frame:
    event: str
    data: dict[str, Any]
    seq: int | None = None


KEEPALIVE = Frame(event="", data={})


class _Hub:
    def __init__(self) -> None:
        self._queues: dict[str, set[asyncio.Queue[int]]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def subscribe(self, run_id: str) -> asyncio.Queue[int]:
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=64)
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = async_client().pubsub(ignore_subscribe_messages=True)
            if run_id not in self._queues:
                self._queues[run_id] = set()
                await self._pubsub.subscribe(run_channel(run_id))
            self._queues[run_id].add(queue)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.get_running_loop().create_task(self._read())
        return queue

    async def unsubscribe(self, run_id: str, queue: asyncio.Queue[int]) -> None:
        async with self._lock:
            queues = self._queues.get(run_id)
            if queues is None:
                return
            queues.discard(queue)
            if not queues:
                del self._queues[run_id]
                await self._pubsub.unsubscribe(run_channel(run_id))

    async def _read(self) -> None:
        while self._queues:
            try:
                msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError):  # readers re-poll Postgres every second, so a Redis hiccup costs latency only
                log.exception("stream hub lost Redis; readers fall back to polling")
                await asyncio.sleep(1.0)
                continue
            if not msg:
                continue
            run_id = msg["channel"].decode().removeprefix("lc:run:")
            seq = int(msg["data"])
            for queue in list(self._queues.get(run_id, ())):
                if not queue.full():  # a doorbell: one pending ring is enough
                    queue.put_nowait(seq)


_HUBS: dict[int, _Hub] = {}


def _hub() -> _Hub:
    loop_id = id(asyncio.get_running_loop())
    if loop_id not in _HUBS:
        _HUBS[loop_id] = _Hub()
    return _HUBS[loop_id]


def _read_page(run_id: str, cursor: int) -> tuple[str | None, list[dict[str, Any]]]:
    try:
        status = run_status(run_id=run_id)  # status first: if terminal, every event is already committed
        return status, run_events_since(run_id=run_id, from_seq=cursor, limit=PAGE)
    finally:
        connection.close()


def to_frame(row: dict[str, Any]) -> Frame | None:
    """Persisted event -> stream frame (SPEC 3.4 mapping)."""
    kind, payload = row["type"], row["payload"]
    if kind == "system_prompt":
        return None
    if kind == "user_input":
        texts = [s.get("text", "") for s in payload.get("segments", []) if s.get("role", "user") == "user"]
        data = {
            "type": "steer",
            "user_input": {
                "text": "\n\n".join(texts),
                "source": payload.get("source", "replay"),
                "seen_at": row["created_at"].isoformat().replace("+00:00", "Z"),
            },
        }
        return Frame("steer", data, row["seq"])
    return Frame(kind, payload, row["seq"])


async def run_frames(run_id: str, from_seq: int, keepalive_s: float) -> AsyncIterator[Frame]:
    """Persisted events with seq > from_seq until the run is terminal."""
    hub = _hub()
    wake = await hub.subscribe(run_id)
    read = sync_to_async(_read_page, thread_sensitive=False)
    cursor, last_sent = from_seq, time.monotonic()
    try:
        while True:
            status, rows = await read(run_id, cursor)
            for row in rows:
                cursor = row["seq"]
                frame = to_frame(row)
                if frame is not None:
                    last_sent = time.monotonic()
                    yield frame
            if len(rows) == PAGE:
                continue
            if status is None or status in TERMINAL:
                return
            try:
                await asyncio.wait_for(wake.get(), timeout=REPOLL_S)
            except TimeoutError:
                if time.monotonic() - last_sent >= keepalive_s:
                    last_sent = time.monotonic()
                    yield KEEPALIVE
    finally:
        await hub.unsubscribe(run_id, wake)


def keepalive_seconds() -> float:
    """LOOMCYCLE_SSE_KEEPALIVE_MS clamped to 1 s .. 5 min (SPEC 3.1)."""
    return max(1.0, min(300.0, settings.LOOMCYCLE.sse_keepalive_ms / 1000))


def sse_encode(frame: Frame) -> bytes:
    if frame is KEEPALIVE:
        return b": keepalive\n\n"
    head = f"id: {frame.seq}\n" if frame.seq is not None else ""
    return f"{head}event: {frame.event}\ndata: {json.dumps(frame.data, separators=(',', ':'))}\n\n".encode()
