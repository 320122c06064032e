"""How a followed stream comes back, against a scripted HTTP peer (httpx.MockTransport: the
client's side of the wire, not our runtime) and a fake clock, so outages of minutes take none."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from loomcycle_http.client import AsyncClient, Client, FollowTimeout
from loomcycle_http.client.events import Event

RUN = "r_00000000000000aa"
AGENT = "a_00000000000000aa"
Script = Callable[[httpx.Request], httpx.Response]
FrameList = list[tuple[str, dict[str, object], int | None]]


_real_monotonic, _real_sleep, _real_asleep = time.monotonic, time.sleep, asyncio.sleep


@dataclass
class Clock:
    """time.monotonic and time.sleep of the test's own thread: sleeping advances it, and nothing
    waits. Other threads of the process (a daemon left by an earlier test in this worker) keep
    the real clock, so their sleeps neither land in `slept` nor move `now`."""

    now: float = 1000.0
    slept: list[float] = field(default_factory=list)
    owner: int = field(default_factory=threading.get_ident)

    def _mine(self) -> bool:
        return threading.get_ident() == self.owner

    def monotonic(self) -> float:
        return self.now if self._mine() else _real_monotonic()

    def sleep(self, seconds: float) -> None:
        if not self._mine():
            _real_sleep(seconds)
            return
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        if not self._mine():
            await _real_asleep(seconds)
            return
        self.sleep(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake.monotonic)
    monkeypatch.setattr(time, "sleep", fake.sleep)
    monkeypatch.setattr(asyncio, "sleep", fake.asleep)
    return fake


class Frames(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An SSE body: `frames`, then (with `drop_after`) the clock jumps and the connection breaks."""

    def __init__(self, frames: FrameList, clock: Clock, drop_after: float) -> None:
        self.body = b"".join(_frame(kind, data, seq) for kind, data, seq in frames)
        self.clock, self.drop_after = clock, drop_after

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        self._end()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body
        self._end()

    def _end(self) -> None:
        if self.drop_after:
            self.clock.now += self.drop_after
            raise httpx.ReadError("connection reset by peer")


def _frame(kind: str, data: dict[str, object], seq: int | None) -> bytes:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def sse(frames: FrameList, clock: Clock, drop_after: float = 0) -> httpx.Response:
    stream = Frames(frames, clock, drop_after)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)


def agent_frame() -> tuple[str, dict[str, object], None]:
    return ("agent", {"run_id": RUN, "agent_id": AGENT}, None)


def follow_sync(
    script: Script,
    *,
    timeout: float = 60.0,
    start: bool = False,
    from_seq: int = 0,
    seen: list[Event] | None = None,
    within: float | None = None,
    until_input: bool = False,
) -> list[Event]:
    """The events of a followed run; `seen` gets each as it comes (kept when the follow raises).
    `timeout` is the reconnect timeout, `within` the follow's own `timeout`."""
    seen = [] if seen is None else seen
    options: dict[str, Any] = {"timeout": within, "until_input": until_input}
    with Client("http://runtime.test", transport=httpx.MockTransport(script)) as lc:
        if start:
            follow = lc.runs.start("scripted", "hi", agent_id=AGENT, reconnect_timeout=timeout, **options)
        else:
            follow = lc.runs.stream(RUN, from_seq=from_seq, reconnect_timeout=timeout, **options)
        seen.extend(follow)
        return seen


def follow_async(
    script: Script,
    *,
    timeout: float = 60.0,
    start: bool = False,
    from_seq: int = 0,
    seen: list[Event] | None = None,
    within: float | None = None,
    until_input: bool = False,
) -> list[Event]:
    seen = [] if seen is None else seen
    options: dict[str, Any] = {"timeout": within, "until_input": until_input}

    async def go() -> list[Event]:
        async with AsyncClient("http://runtime.test", transport=httpx.MockTransport(script)) as lc:
            if start:
                follow = lc.runs.start("scripted", "hi", agent_id=AGENT, reconnect_timeout=timeout, **options)
            else:
                follow = lc.runs.stream(RUN, from_seq=from_seq, reconnect_timeout=timeout, **options)
            async for event in follow:
                seen.append(event)
            return seen

    return asyncio.run(go())


FOLLOWERS = [follow_sync, follow_async]


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_each_drop_gets_the_full_reconnect_timeout(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    """Two drops 100 s apart, with a 60 s timeout: both are retried (the clock restarts with each stream)."""
    streams = [
        lambda: sse([agent_frame(), ("text", {"text": "a"}, 1)], clock, drop_after=100),
        lambda: sse([agent_frame(), ("text", {"text": "b"}, 2)], clock, drop_after=100),
        lambda: sse([agent_frame(), ("done", {"stop_reason": "end_turn"}, 3)], clock),
    ]
    seen: list[str | None] = []

    def script(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("last-event-id"))
        return streams[len(seen) - 1]()

    events = follow(script, timeout=60.0)
    assert [(e.type, e.seq) for e in events] == [("agent", None), ("text", 1), ("text", 2), ("done", 3)]
    assert seen == ["0", "1", "2"]


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_an_outage_longer_than_the_timeout_still_fails(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    from loomcycle_http.client import ConnectionFailed

    def script(request: httpx.Request) -> httpx.Response:
        if request.headers.get("last-event-id") == "0" and not clock.slept:
            return sse([agent_frame(), ("text", {"text": "a"}, 1)], clock, drop_after=1)
        raise httpx.ConnectError("connection refused")

    with pytest.raises(ConnectionFailed):
        follow(script, timeout=5.0)
    assert 5.0 <= sum(clock.slept) <= 5.0 + 2.0  # retried for the timeout, with backoff, then gave up


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_a_clean_close_of_a_finished_run_ends_the_stream(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    """`--from-seq` past a finished run's last event: the stream closes without `done`; one look at the run ends it."""
    calls: list[str] = []

    def script(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path.endswith("/stream"):
            return sse([agent_frame()], clock)
        return httpx.Response(200, json={"run_id": RUN, "state": "completed"})

    events = follow(script, from_seq=99)
    assert [e.type for e in events] == ["agent"]
    assert calls == [f"/v1/runs/{RUN}/stream", f"/v1/runs/{RUN}"]


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_a_clean_close_of_a_live_run_reopens_after_a_backoff(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    opened: list[str | None] = []

    def script(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/stream"):
            return httpx.Response(200, json={"run_id": RUN, "state": "running"})
        opened.append(request.headers.get("last-event-id"))
        if len(opened) < 4:
            return sse([agent_frame()], clock)  # closed by the server, nothing new, no end
        return sse([agent_frame(), ("done", {"stop_reason": "end_turn"}, 4)], clock)

    events = follow(script, from_seq=3)
    assert [e.type for e in events] == ["agent", "done"]
    assert len(opened) == 4
    assert len(clock.slept) == 3 and clock.slept == sorted(clock.slept) and clock.slept[0] > 0  # growing waits


def test_a_post_dropped_before_its_agent_frame_still_yields_it_on_reattach(clock: Clock) -> None:
    def script(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return sse([], clock, drop_after=0.5)
        if request.url.path == f"/v1/agents/{AGENT}":
            return httpx.Response(200, json={"run_id": RUN, "agent_id": AGENT, "state": "running"})
        return sse([agent_frame(), ("session", {"session_id": "s_1"}, None), ("done", {}, 2)], clock)

    events = follow_sync(script, start=True)
    assert [e.type for e in events] == ["agent", "session", "done"]
    assert events[0].data["run_id"] == RUN


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_a_run_not_there_yet_after_a_dropped_post_is_looked_up_again(
    clock: Clock, follow: Callable[..., list[Event]]
) -> None:
    """The POST broke before its answer and the run is not found by its agent_id yet (the request
    may still be on its way): a drop, looked up again after a back-off, not a NotFound."""
    looked: list[int] = []

    def script(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return sse([], clock, drop_after=0.5)
        if request.url.path == f"/v1/agents/{AGENT}":
            looked.append(1)
            if len(looked) < 3:
                return httpx.Response(404, json={"error": {"code": "unknown_agent_id", "message": "no such run"}})
            return httpx.Response(200, json={"run_id": RUN, "agent_id": AGENT, "state": "running"})
        return sse([agent_frame(), ("done", {}, 2)], clock)

    events = follow(script, start=True)
    assert [e.type for e in events] == ["agent", "done"]
    assert len(looked) == 3 and len(clock.slept) == 3  # the drop of the POST, then two looks that found nothing


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_until_input_ends_the_follow_at_awaiting_input(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    """An interactive run's turn: the follow ends after the `awaiting_input` event, on the stream
    that brought it, without asking the run or re-opening."""
    calls: list[str] = []
    frames: FrameList = [agent_frame(), ("text", {"text": "a"}, 1), ("awaiting_input", {}, 2), ("text", {}, 3)]

    def script(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return sse(frames, clock)

    events = follow(script, until_input=True)
    assert [(e.type, e.seq) for e in events] == [("agent", None), ("text", 1), ("awaiting_input", 2)]
    assert calls == [f"/v1/runs/{RUN}/stream"]


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_a_follow_past_its_timeout_raises_follow_timeout(clock: Clock, follow: Callable[..., list[Event]]) -> None:
    """A stream that keeps breaking before the run ends: re-attached until the follow's `timeout`
    (well inside `reconnect_timeout`), then FollowTimeout with the run's ids and last seq. Each wait
    for headers or a frame is the time left, but never under 2 s."""
    reads: list[float] = []

    def script(request: httpx.Request) -> httpx.Response:
        reads.append(request.extensions["timeout"]["read"])
        seq = len(reads)
        return sse([agent_frame(), ("text", {"text": "x"}, seq)], clock, drop_after=4)

    seen: list[Event] = []
    with pytest.raises(FollowTimeout) as late:
        follow(script, timeout=60.0, seen=seen, within=10.0)
    assert (late.value.run_id, late.value.agent_id, late.value.last_seq) == (RUN, AGENT, len(reads))
    assert [e.seq for e in seen if e.type == "text"] == list(range(1, len(reads) + 1))
    assert reads[0] == 10.0 and reads[-1] == 2.0 and len(reads) == 3  # 10 s, then ~6 s, then under 2 s left
    assert sum(clock.slept) <= 10.0
