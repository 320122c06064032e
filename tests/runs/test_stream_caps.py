"""Per-principal caps on open event streams and their lifetime (issue 16
item 5), on a web process of their own started with a cap of 2 streams and
a lifetime of 2 s: a third SSE stream or WebSocket of the same principal is
refused (429 `stream_limit_exceeded` / close 4429) and starts no run, another
principal is unaffected, a closed stream frees its slot, and a stream open
for the lifetime ends (SSE comment / close 4408)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.runs.models import Run
from apps.substrate import tokens
from tests.conftest import daphne, wait_for

pytestmark = pytest.mark.usefixtures("agents")

CAP, LIFETIME_S = 2, 2


@pytest.fixture(scope="module")
def capped_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    env = {"LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL": str(CAP), "LOOMCYCLE_SSE_KEEPALIVE_MS": "200"}
    with daphne(stack_env, logdir, "daphne-capped", LOOMCYCLE_MAX_STREAM_SECONDS="600", **env) as base:
        yield base


@pytest.fixture(scope="module")
def short_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    env = {"LOOMCYCLE_MAX_STREAM_SECONDS": str(LIFETIME_S), "LOOMCYCLE_SSE_KEEPALIVE_MS": "200"}
    with daphne(stack_env, logdir, "daphne-short", **env) as base:
        yield base


@pytest.fixture
def capped(people: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Bearer headers of principals this test alone uses. Stream slots are counted per
    (tenant, subject) in Redis, cluster-wide: another test's stream of `alice` that its web
    process has not yet seen hang up still holds one of alice's slots, so a capped test
    must not share a subject with any other test."""
    out = {}
    for who, tenant in (("alice", "acme"), ("charlie", "beta")):
        subject = f"{who}-{uuid.uuid4().hex[:8]}"
        token = tokens.token_create(name=subject, tenant_id=tenant, subject=subject, scopes=["substrate:tenant"])
        out[who] = {"authorization": f"Bearer {token['token']}"}
    return out


def parked_run(client: httpx.Client) -> str:
    """An interactive run that parks awaiting input: its streams stay open."""
    body = {"agent": "echo", "prompt": "hi", "interactive": True, "background": True}
    resp = client.post("/v1/runs", json=body)
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def open_sse(client: httpx.Client, run_id: str) -> Any:
    cm = client.stream("GET", f"/v1/runs/{run_id}/stream")
    resp = cm.__enter__()
    return cm, resp


def try_open(client: httpx.Client, run_id: str) -> Any:
    """The open stream's context manager, or None (closed again) when refused."""
    cm, resp = open_sse(client, run_id)
    if resp.status_code == 200:
        return cm
    cm.__exit__(None, None, None)
    return None


def assert_stream_refused(resp: httpx.Response) -> None:
    assert resp.status_code == 429, resp.read()
    body = resp.json()
    assert body["code"] == "stream_limit_exceeded" and body["cap"] == CAP
    assert resp.headers["Retry-After"]


def test_a_principal_over_its_stream_cap_gets_429_and_starts_no_run(
    capped_web: str, stack: Any, capped: dict[str, dict[str, str]]
) -> None:
    with (
        httpx.Client(base_url=capped_web, timeout=30, headers=capped["alice"]) as alice,
        httpx.Client(base_url=capped_web, timeout=30, headers=capped["charlie"]) as charlie,
    ):
        run_id = parked_run(alice)
        held = [open_sse(alice, run_id) for _ in range(CAP)]
        try:
            assert all(resp.status_code == 200 for _, resp in held)
            assert_stream_refused(alice.get(f"/v1/runs/{run_id}/stream"))
            before = Run.objects.count()
            assert_stream_refused(alice.post("/v1/runs", json={"agent": "echo", "prompt": "hi"}))
            assert Run.objects.count() == before
            ws_url = capped_web.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
            with connect(ws_url, additional_headers=capped["alice"]) as ws, pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 4429
            other = parked_run(charlie)  # another principal has slots of its own
            with charlie.stream("GET", f"/v1/runs/{other}/stream") as resp:
                assert resp.status_code == 200
        finally:
            held.pop()[0].__exit__(None, None, None)
        # The closed stream gives its slot back (once the server notices the hang-up).
        reopened = wait_for(lambda: try_open(alice, run_id), timeout=20)
        reopened.__exit__(None, None, None)
        for cm, _ in held:
            cm.__exit__(None, None, None)


def test_a_waiting_runs_batch_holds_a_stream_slot(
    capped_web: str, stack: Any, capped: dict[str, dict[str, str]]
) -> None:
    """Issue 33: runs:batch holds its request open up to 30 min, so it counts as one of the
    principal's streams; past the cap a batch is 429 and starts no run."""
    slow = 'MOCK_SCRIPT: [{"text": "late", "sleep_ms": 3000}]'
    body = {"spawns": [{"agent": "fan-child", "prompt": slow}], "timeout_ms": 30_000}
    answered: dict[str, int] = {}
    with httpx.Client(base_url=capped_web, timeout=60, headers=capped["alice"]) as alice:
        waiting = threading.Thread(
            target=lambda: answered.setdefault("status", alice.post("/v1/runs:batch", json=body).status_code)
        )
        waiting.start()
        try:
            wait_for(lambda: Run.objects.filter(agent_name="fan-child").exists(), timeout=10)  # the batch waits
            run_id = parked_run(alice)
            with alice.stream("GET", f"/v1/runs/{run_id}/stream") as stream:  # the second slot
                assert stream.status_code == 200
                before = Run.objects.count()
                assert_stream_refused(alice.post("/v1/runs:batch", json=body))
                assert Run.objects.count() == before
        finally:
            waiting.join(30)
    assert answered["status"] == 200


def test_a_stream_ends_at_its_lifetime_and_can_reattach(short_web: str, stack: Any) -> None:
    with httpx.Client(base_url=short_web, timeout=30) as client:
        run_id = parked_run(client)
        started = time.monotonic()
        with client.stream("GET", f"/v1/runs/{run_id}/stream") as resp:
            body = b"".join(resp.iter_bytes())
        elapsed = time.monotonic() - started
        assert body.endswith(b": stream lifetime reached; re-attach with Last-Event-ID\n\n")
        assert LIFETIME_S <= elapsed < LIFETIME_S + 5, elapsed
        assert Run.objects.get(id=run_id).status == "awaiting_input"  # the run goes on
        ws_url = short_web.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
        with connect(ws_url) as ws, pytest.raises(ConnectionClosed) as info:
            while True:
                ws.recv(timeout=LIFETIME_S + 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4408
