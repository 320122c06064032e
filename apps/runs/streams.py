"""Gap-free run event streams for SSE and WebSocket.

Postgres is what readers read; Redis pub/sub (`lc:run:<id>`, published by the
worker after each commit) only wakes them. A reader subscribes BEFORE its
first read, reads `seq > cursor` in pages, and re-reads on every wake-up and
at least every second (a lost wake-up costs latency, never events). One Redis
connection per event loop multiplexes every open stream (apps.core.pubsub).

Between committed events, the live text and thinking of the model call in flight
(`lc:live:<id>`, apps.runs.livetokens) are merged in as id-less frames by
apps.runs.livemerge; a reader that falls behind them (its queue full) loses
pieces, sees the gap and catches up from the Redis snapshot or the commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from apps.core.pubsub import hub
from apps.core.timefmt import iso_z
from apps.runs.dispatch import run_channel
from apps.runs.livemerge import LiveMerge, Out
from apps.runs.livetokens import live_channel, read_snapshot
from apps.runs.models import TERMINAL, Run
from apps.runs.selectors import run_events_since, run_first_announcement_seq, run_status_step

if TYPE_CHECKING:
    from apps.gateway.fairness.streams import StreamSlot

log = logging.getLogger("loomcycle.streams")

PAGE = 500
REPOLL_S = 1.0
QUEUE = 256  # doorbells and live pieces waiting for one reader; past it, pieces are dropped (a gap)
LAST_STEP = 2**62  # a terminal run: every step is committed


@dataclass(frozen=True)
class Frame:
    event: str
    data: dict[str, Any]
    seq: int | None = None


KEEPALIVE = Frame(event="", data={})
# The last bytes of a stream that reached LOOMCYCLE_MAX_STREAM_SECONDS (an SSE comment).
LIFETIME_COMMENT = b": stream lifetime reached; re-attach with Last-Event-ID\n\n"


def _read_page(run_id: str, cursor: int) -> tuple[tuple[str, int] | None, list[dict[str, Any]]]:
    """Events after `cursor`, then the run's status and step: every step below that step has its
    events committed (so live pieces of it are stale). A terminal run's events are read again:
    its last commit may have landed between the two reads."""
    try:
        rows = run_events_since(run_id=run_id, from_seq=cursor, limit=PAGE)
        state = run_status_step(run_id=run_id)
        if (state is None or state[0] in TERMINAL) and len(rows) < PAGE:
            rows = run_events_since(run_id=run_id, from_seq=cursor, limit=PAGE)
        return state, rows
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


async def run_frames(
    run_id: str, from_seq: int, keepalive_s: float, *, live: bool = True
) -> AsyncGenerator[Frame, None]:
    """Persisted events with seq > from_seq until the run is terminal; with `live`, the model's
    text and thinking as they are produced in between (apps.runs.livemerge)."""
    bells = hub()
    wake = await bells.subscribe(run_channel(run_id), maxsize=QUEUE)
    if live:
        await bells.subscribe(live_channel(run_id), queue=wake)
    read = sync_to_async(_read_page, thread_sensitive=False)
    cursor, last_sent = from_seq, time.monotonic()
    merge, sync = LiveMerge(), live
    try:
        while True:
            state, rows = await read(run_id, cursor)
            for row in rows:
                cursor = row["seq"]
                for frame in _committed(merge, row):
                    last_sent = time.monotonic()
                    yield frame
            if len(rows) == PAGE:
                continue
            terminal = state is None or state[0] in TERMINAL
            outs = merge.settle(LAST_STEP if state is None or terminal else state[1])
            if sync and not terminal:
                sync = False
                outs += merge.snapshot(await read_snapshot(run_id))
            for out in outs:
                yield Frame(*out)
            if terminal:
                return
            async for piece in _until_reread(wake, merge, keepalive_s - (time.monotonic() - last_sent)):
                if piece is None:
                    sync = True
                    break
                last_sent = time.monotonic()
                yield piece
    finally:
        await bells.unsubscribe(run_channel(run_id), wake)
        if live:
            await bells.unsubscribe(live_channel(run_id), wake)


def _committed(merge: LiveMerge, row: dict[str, Any]) -> list[Frame]:
    frame = to_frame(row)
    if frame is None:
        return []
    outs: list[Out] = merge.voided_before(frame.event, frame.data)
    outs.append(merge.committed(frame.event, frame.data, row["seq"]))
    return [Frame(*out) for out in outs]


async def _until_reread(
    wake: asyncio.Queue[str], merge: LiveMerge, keepalive_in: float
) -> AsyncGenerator[Frame | None, None]:
    """Live frames until a doorbell or REPOLL_S of quiet (then the caller re-reads Postgres); a
    keepalive when the stream was quiet that long; None when a gap asks for the Redis snapshot."""
    while True:
        try:
            data = await asyncio.wait_for(wake.get(), timeout=REPOLL_S)
        except TimeoutError:
            if keepalive_in <= REPOLL_S:
                yield KEEPALIVE
            return
        outs, reread = _drain(data, wake, merge)
        for out in coalesced(outs):
            yield Frame(*out)
        if reread is not None:
            if reread:
                yield None
            return


def _drain(data: str, wake: asyncio.Queue[str], merge: LiveMerge) -> tuple[list[Out], bool | None]:
    """`data` and whatever else is queued already, through the merge: a reader that fell behind
    sends what piled up as one frame per kind (fewer frames to write under load, none held back).
    The second value: None to keep waiting, False for a doorbell (re-read Postgres), True for a
    gap (re-read, then the snapshot)."""
    outs: list[Out] = []
    while True:
        if not data.startswith("{"):  # a doorbell: a commit to read
            return outs, False
        got, ok = merge.delta(json.loads(data))
        outs += got
        if not ok:
            return outs, True
        if wake.empty():
            return outs, None
        data = wake.get_nowait()


def coalesced(outs: list[Out]) -> list[Out]:
    """Consecutive live frames of one kind joined into one (their text concatenated)."""
    out: list[Out] = []
    for event, data, seq in outs:
        prev = out[-1] if out else None
        if prev and seq is None and prev[2] is None and prev[0] == event and event in ("text", "thinking"):
            out[-1] = (event, {**prev[1], "text": prev[1]["text"] + data["text"]}, None)
        else:
            out.append((event, data, seq))
    return out


def keepalive_seconds() -> float:
    """LOOMCYCLE_SSE_KEEPALIVE_MS clamped to 1 s .. 5 min (SPEC 3.1)."""
    return max(1.0, min(300.0, settings.LOOMCYCLE.sse_keepalive_ms / 1000))


async def run_sse(run: Run, slot: StreamSlot, start: int, *, live: bool) -> AsyncGenerator[bytes, None]:
    """The bytes of GET /v1/runs/{id}/stream (and the console's live tail, apps.console):
    the `agent` frame, then `run_frames` from `start`, in the caller's stream slot until
    the run ends or the slot's lifetime does (then LIFETIME_COMMENT)."""
    async with slot.held():
        yield sse_encode(Frame("agent", {"agent_id": run.agent_id, "run_id": run.id, "session_id": run.session_id}))
        async with aclosing(run_frames(run.id, start, keepalive_seconds(), live=live)) as frames:
            async for frame in frames:
                yield sse_encode(frame)
                if slot.expired():
                    yield LIFETIME_COMMENT
                    return


def sse_encode(frame: Frame) -> bytes:
    if frame is KEEPALIVE:
        return b": keepalive\n\n"
    head = f"id: {frame.seq}\n" if frame.seq is not None else ""
    return f"{head}event: {frame.event}\ndata: {json.dumps(frame.data, separators=(',', ':'))}\n\n".encode()
