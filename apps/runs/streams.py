"""Gap-free run event streams for SSE and WebSocket.

Postgres is what readers read; Redis pub/sub (`lc:run:<id>`, published by the
worker after each commit) only wakes them. A reader subscribes BEFORE its
first read, reads `seq > cursor` in pages, and re-reads on every wake-up and
at least every second (a lost wake-up costs latency, never events). One Redis
connection per event loop multiplexes every open stream (apps.core.pubsub).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from apps.core.pubsub import hub
from apps.core.timefmt import iso_z
from apps.runs.dispatch import run_channel
from apps.runs.models import TERMINAL, Run
from apps.runs.selectors import run_events_since, run_first_announcement_seq, run_status

log = logging.getLogger("loomcycle.streams")

PAGE = 500
REPOLL_S = 1.0


@dataclass(frozen=True)
class Frame:
    event: str
    data: dict[str, Any]
    seq: int | None = None


KEEPALIVE = Frame(event="", data={})


def _read_page(run_id: str, cursor: int) -> tuple[str | None, list[dict[str, Any]]]:
    try:
        status = run_status(run_id=run_id)  # status first: if terminal, every event is already committed
        return status, run_events_since(run_id=run_id, from_seq=cursor, limit=PAGE)
    finally:
        connection.close()


def _admitted_from(run: Run) -> int:
    try:
        first = run_first_announcement_seq(run_id=run.id, upto=run.last_seq)
    finally:
        connection.close()
    return run.last_seq if first is None else first - 1


async def admitted_from(run: Run) -> int:
    """Where the stream of the caller that just admitted `run` starts (POST /v1/runs, the session
    routes, gRPC Run and Continue): an interactive run's at 0, replaying its initial input as a
    `steer` frame (SPEC 3.4); any other's after its first events, except the `capability_inert`
    announcements among them (apps.runs.inert), which the caller sees before the run's output."""
    if run.interactive:
        return 0
    return await sync_to_async(_admitted_from, thread_sensitive=False)(run)


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
                "seen_at": iso_z(row["created_at"]),
            },
        }
        return Frame("steer", data, row["seq"])
    return Frame(kind, payload, row["seq"])


async def run_frames(run_id: str, from_seq: int, keepalive_s: float) -> AsyncGenerator[Frame, None]:
    """Persisted events with seq > from_seq until the run is terminal."""
    bells = hub()
    wake = await bells.subscribe(run_channel(run_id))
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
        await bells.unsubscribe(run_channel(run_id), wake)


def keepalive_seconds() -> float:
    """LOOMCYCLE_SSE_KEEPALIVE_MS clamped to 1 s .. 5 min (SPEC 3.1)."""
    return max(1.0, min(300.0, settings.LOOMCYCLE.sse_keepalive_ms / 1000))


def sse_encode(frame: Frame) -> bytes:
    if frame is KEEPALIVE:
        return b": keepalive\n\n"
    head = f"id: {frame.seq}\n" if frame.seq is not None else ""
    return f"{head}event: {frame.event}\ndata: {json.dumps(frame.data, separators=(',', ':'))}\n\n".encode()
