"""Live text deltas (issue 36, apps.runs.livetokens/livemerge) against a real Daphne, workers and Redis.

The mock streams a reply in many small pieces `chunk_ms` apart and records each piece's send time
in Redis (apps.gateway.providers.mock_chunks): a client that saw a text frame before the mock sent
its last piece saw it live, whatever the host's speed. The concatenation rule (docs/api.md, "Live
text") is checked with `client_text`: a client's text is its `text` frames joined, dropping the
id-less frames an id-less `retry` voids."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from apps.runs.engine import turncancel
from apps.runs.models import RunStatus
from tests.conftest import ALICE, daphne, for_sandbox, run_row, wait_for, wait_status
from tests.factories.live import (
    REPLY,
    VOIDS,
    client_text,
    committed_text,
    live_frames,
    read_sse,
    script,
    sent_times,
)
from tests.factories.runs import start
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_sse_client_sees_text_while_the_mock_still_streams_and_the_exact_text_at_the_end(http: httpx.Client) -> None:
    body = {"agent": "scripted", "prompt": script()}
    with http.stream("POST", "/v1/runs", json=body) as resp:
        assert resp.status_code == 200
        frames = read_sse(resp)
    run_id = frames[1]["data"]["run_id"]
    sent = sent_times(run_id)
    assert len(sent) == -(-len(REPLY) // 3)
    first_live = live_frames(frames)[0]["at"]
    assert first_live < sent[-1], "the first text frame came after the mock had sent its last piece"
    assert client_text(frames) == committed_text(run_id) == REPLY
    assert [f["event"] for f in frames if f.get("id") is not None][-3:] == ["text", "usage", "done"]


def test_connecting_in_the_middle_and_after_the_call_each_gives_the_exact_text(http: httpx.Client) -> None:
    run = start("scripted", script(chunk_ms=60))
    wait_for(lambda: len(sent_times(run.id)) >= 10, timeout=30)
    with http.stream("GET", f"/v1/runs/{run.id}/stream") as resp:
        middle = read_sse(resp)
    assert live_frames(middle) and len(live_frames(middle)[0]["data"]["text"]) >= 9  # what was produced so far
    wait_status(run.id, RunStatus.COMPLETED)
    with http.stream("GET", f"/v1/runs/{run.id}/stream") as resp:
        after = read_sse(resp)
    assert [f["data"]["text"] for f in after if f["event"] == "text"] == [REPLY]  # the committed event, whole
    assert client_text(middle) == client_text(after) == committed_text(run.id) == REPLY


def test_reattach_with_last_event_id_in_the_middle_of_a_call_gives_the_rest_exactly(http: httpx.Client) -> None:
    run = start("scripted", script(chunk_ms=60))
    with http.stream("GET", f"/v1/runs/{run.id}/stream") as resp:
        first = read_sse(resp, until=lambda fs: sum(len(f["data"]["text"]) for f in live_frames(fs)) >= 30)
    last_id = max(f["id"] for f in first if f.get("id") is not None)
    assert run_row(run.id).status == RunStatus.RUNNING  # cut in the middle of the call
    headers = {"Last-Event-ID": str(last_id)}
    with http.stream("GET", f"/v1/runs/{run.id}/stream", headers=headers) as resp:
        second = read_sse(resp)
    # the live frames after the last id are not confirmed: the re-attached stream sends them again
    kept = client_text([f for f in first if f.get("id") is not None])
    assert kept + client_text(second) == committed_text(run.id) == REPLY


def test_websocket_client_sees_text_live_and_the_exact_text(web: str) -> None:
    run = start("scripted", script())
    url = web.replace("http://", "ws://") + f"/ws/runs/{run.id}/"
    frames: list[dict[str, Any]] = []
    with connect(url) as ws:
        for raw in ws:
            msg = json.loads(raw)
            frames.append({"event": msg["event"], "data": msg["data"], "id": msg["seq"], "at": time.time()})
    assert live_frames(frames)[0]["at"] < sent_times(run.id)[-1]
    assert client_text(frames) == committed_text(run.id) == REPLY


def test_a_secret_the_mock_streams_in_pieces_is_never_shown(http: httpx.Client) -> None:
    secret = "hunter2-Sesame-0451-x"
    text = f"the vault code is {secret} and nothing else matters here"
    body = {
        "agent": "scripted",
        "prompt": script(text, chunk_chars=2, chunk_ms=20),
        "user_credentials": {"vault": secret},
    }
    with http.stream("POST", "/v1/runs", json=body) as resp:
        frames = read_sse(resp)
    run_id = frames[1]["data"]["run_id"]
    stored = committed_text(run_id)
    assert stored == text.replace(secret, "[redacted:vault]")
    assert live_frames(frames), "nothing was streamed live"
    shown = ""
    for f in frames:
        if f["event"] == "text":
            shown += f["data"]["text"]
            assert stored.startswith(shown) or shown == stored  # never more than the stored copy shows
    assert shown == stored and secret[:4] not in shown


def test_worker_killed_mid_stream_the_stream_ends_with_the_committed_text(
    http: httpx.Client, stack: WorkerPool
) -> None:
    run = start("scripted", script(chunk_chars=6, chunk_ms=50))  # short: a loaded host may lose a 3 s test lease
    frames: list[dict[str, Any]] = []

    def read() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=90) as client:
            with client.stream("GET", f"/v1/runs/{run.id}/stream") as resp:
                frames.extend(read_sse(resp))

    reader = threading.Thread(target=read)
    reader.start()
    wait_for(lambda: len(sent_times(run.id)) >= 8, timeout=30)
    owner = run_row(run.id).lease_owner
    stack.kill(int(owner.split(":")[-2]))  # kill -9 in the middle of the streamed call
    reader.join(90)
    row = run_row(run.id)
    assert row.status == RunStatus.COMPLETED, (row.error, row.attempts)
    assert any(f["event"] == "retry" and f.get("id") is None for f in frames)  # the first attempt's text: void
    assert client_text(frames) == committed_text(run.id) == REPLY


@pytest.fixture(scope="module")
def second_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    with daphne(stack_env, logdir, "daphne-live", start_timeout=120) as base:
        yield base


def test_a_hundred_concurrent_streaming_runs_on_two_web_processes_each_get_their_own_exact_text(
    web: str, second_web: str, people: dict[str, dict[str, str]]
) -> None:
    """Two tenants (acme's alice, beta's charlie), 50 runs each, spread over two web processes:
    every client's text is its own run's committed text, and another tenant's stream is a 404."""
    clients = [("alice", web), ("charlie", second_web)] * 50
    results: list[tuple[str, str, list[dict[str, Any]]]] = []

    def one(n: int) -> None:
        who, base = clients[n]
        text = " ".join(f"run{n:03d}-w{i}" for i in range(12))
        body = {"agent": "scripted", "prompt": script(text, chunk_chars=8, chunk_ms=40)}
        with httpx.Client(base_url=base, timeout=120, headers=people[who]) as client:
            with client.stream("POST", "/v1/runs", json=body) as resp:
                assert resp.status_code == 200, resp.read()
                results.append((who, text, read_sse(resp)))

    with ThreadPoolExecutor(max_workers=100) as pool:
        list(pool.map(one, range(100)))
    assert len(results) == 100
    live = 0
    for _, text, frames in results:
        run_id = frames[1]["data"]["run_id"]
        assert client_text(frames) == committed_text(run_id) == text
        live += bool(live_frames(frames))
    assert live >= 50, f"only {live} of 100 clients saw live text"
    alices = next(frames[1]["data"]["run_id"] for who, _, frames in results if who == "alice")
    other = httpx.get(f"{second_web}/v1/runs/{alices}/stream", headers=people["charlie"], timeout=30)
    assert other.status_code == 404


def test_a_stream_that_breaks_and_falls_back_voids_the_text_it_showed(http: httpx.Client) -> None:
    """The mock breaks its stream after 20 characters (a retryable 500), so the call is retried on
    `mock`, then falls back to `mock-stable`, which plays it whole: every broken attempt's live text
    is voided by a live `retry`, and the client's text is the committed one."""
    body = {"agent": "scripted-fallback", "prompt": script(chunk_chars=5, chunk_ms=20, break_after_chars=20)}
    with http.stream("POST", "/v1/runs", json=body) as resp:
        frames = read_sse(resp)
    run_id = frames[1]["data"]["run_id"]
    voids = [f for f in frames if f["event"] in VOIDS and f.get("id") is None]
    committed = [f["event"] for f in frames if f.get("id") is not None]
    # each void is named for its cause: `retry` for the same provider's retry, then
    # `provider_fallback` for the switch to mock-stable, the details under the frame's usual key
    assert [v["event"] for v in voids][-1] == "provider_fallback", [v["event"] for v in voids]
    assert set(v["event"] for v in voids) == {"retry", "provider_fallback"}
    for v in voids:
        details = v["data"]["fallback" if v["event"] == "provider_fallback" else "retry"]
        assert details["reason"] == "live_text_discarded" and v["data"]["live"] is True
        assert v["data"]["discarded_chars"]["text"] > 0
    assert "provider_fallback" in committed and "retry" in committed  # the step's own record, as before
    assert client_text(frames) == committed_text(run_id) == REPLY
    assert run_row(run_id).status == RunStatus.COMPLETED


def test_thinking_streams_live_before_the_call_ends_and_concatenates_to_the_committed_thinking(
    http: httpx.Client,
) -> None:
    """The mock streams the step's thinking in pieces before its text: live `thinking` frames
    arrive before the mock sent its last thinking piece, and the `thinking` frames of the
    connection join to the committed thinking exactly, as `text` frames do to the text."""
    thinking = " ".join(f"idea{i:02d}" for i in range(20))
    body = {"agent": "scripted", "prompt": script(thinking=thinking)}
    with http.stream("POST", "/v1/runs", json=body) as resp:
        assert resp.status_code == 200
        frames = read_sse(resp)
    run_id = frames[1]["data"]["run_id"]
    sent = sent_times(run_id, "thinking")
    assert len(sent) == -(-len(thinking) // 3)
    first = live_frames(frames, "thinking")[0]["at"]
    assert first < sent[-1], "the first thinking frame came after the mock had sent its last thinking piece"
    assert first < live_frames(frames)[0]["at"]  # thinking before text, as the model produced them
    assert client_text(frames, "thinking") == committed_text(run_id, "thinking") == thinking
    assert client_text(frames) == committed_text(run_id) == REPLY


def test_a_turn_cancel_while_thinking_streams_voids_the_live_thinking_with_a_turn_cancelled_frame(
    http: httpx.Client,
) -> None:
    """An interactive run's turn is cut while the mock streams its thinking: the cut turn keeps no
    thinking, so the live thinking shown is voided by an id-less `turn_cancelled` frame (after the
    committed `turn_cancelled` event), and the client's thinking is the committed (none)."""
    for_sandbox(Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "volumes-static" / "turnfork")  # the agent's volume
    thinking = " ".join(f"idea{i:02d}" for i in range(200))
    run = start("turnfork", script(thinking=thinking, chunk_chars=4, chunk_ms=50))
    frames: list[dict[str, Any]] = []

    def read() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=60) as client:
            with client.stream("GET", f"/v1/runs/{run.id}/stream") as resp:
                voided = lambda fs: any(f["event"] == "turn_cancelled" and f.get("id") is None for f in fs)  # noqa: E731
                frames.extend(read_sse(resp, until=voided))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: len(sent_times(run.id, "thinking")) >= 10, timeout=30)
    turncancel.run_turn_cancel(principal=ALICE, run_id=run.id, reason="stop")
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    reader.join(30)
    assert not reader.is_alive(), [f["event"] for f in frames]
    void = next(f for f in frames if f["event"] == "turn_cancelled" and f.get("id") is None)
    assert void["data"]["turn_cancelled"]["reason"] == "live_text_discarded"
    assert void["data"]["discarded_chars"]["thinking"] > 0 and live_frames(frames, "thinking")
    assert any(f["event"] == "turn_cancelled" and f.get("id") is not None for f in frames)
    assert client_text(frames, "thinking") == committed_text(run.id, "thinking") == ""
