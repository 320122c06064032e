"""Cross-instance resume (issue 23, "Snapshots"): paused runs captured on
instance A (the suite's stack) continue on instance B, a second, empty
runtime with its own embedded Postgres and Redis (`manage.py up` in its own
data dir), with their transcripts intact."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.snapshots.envelope import canonical, checksum_of
from tests.conftest import ALICE, wait_for, wait_status
from tests.factories.snapshots import SUBSCRIBE, scripted
from tests.procs import ROOT, WorkerPool, free_port, wait_http

pytestmark = pytest.mark.usefixtures("agents")

CONFIGS = ",".join(str(ROOT / p) for p in ("loomcycle.yaml", "bench/circuit.yaml", "tests/loomcycle.test.yaml"))


@pytest.fixture
def instance_b(server_tmp: Path) -> Iterator[str]:
    """A second runtime: `manage.py up` on its own embedded Postgres and Redis, the suite's agents loaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    port = free_port()
    env.update(
        LOOMCYCLE_DATA_DIR=str(server_tmp / "data"),
        LOOMCYCLE_VOLUMES_ROOT=str(server_tmp / "volumes"),
        LOOMCYCLE_LISTEN_ADDR=f"127.0.0.1:{port}",
        LOOMCYCLE_WORKER_PROCESSES="1",
        LOOMCYCLE_WORKER_CONCURRENCY="4",
        LOOMCYCLE_FLOWER_ENABLED="0",
        LOOMCYCLE_CONFIG_FILES=CONFIGS,
    )
    env.pop("LOOMCYCLE_EMBEDDED_POSTGRES", None)
    (server_tmp / "volumes").mkdir()
    log = server_tmp / "up.log"
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _events(base: str, run_id: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{base}/v1/runs/{run_id}/events", params={"limit": 5000}, timeout=30).json()
    return list(body["events"])


def _texts(base: str, run_id: str) -> list[str]:
    return [str(e["payload"]["text"]) for e in _events(base, run_id) if e["type"] == "text"]


def _park_three_runs_and_pause() -> tuple[Run, Run, Run]:
    """On A: one run awaiting input, one parked on a channel, one paused between iterations."""
    asking = scripted([{"text": "first turn"}, {"echo": True}], interactive=True)
    waiting = scripted([{"tool": "Channel", "input": SUBSCRIBE}, {"echo": True}])
    between = scripted(
        [{"text": "working", "tool": "Context", "input": {"op": "time"}, "sleep_ms": 1500}, {"echo": True}]
    )
    wait_status(asking.id, RunStatus.AWAITING_INPUT, timeout=30)
    wait_status(waiting.id, RunStatus.WAITING_CHANNEL, timeout=30)
    wait_for(lambda: RunEvent.objects.filter(run_id=between.id, type="started").exists(), timeout=30)
    paused = asyncio.run(services.runtime_pause(timeout_ms=30_000))  # `between` is inside its first iteration
    assert paused["state"] == "paused" and not paused["warnings"]
    return asking, waiting, between


def _capture_on_a(web: str) -> dict[str, Any]:
    created = httpx.post(f"{web}/v1/_snapshots", json={"label": "move to b"}, timeout=60)
    assert created.status_code == 201, created.text
    meta = created.json()
    assert meta["id"].startswith("snap_") and meta["schema_version"] == "1.0" and meta["byte_size"] > 0
    assert (meta["runtime_state"], meta["runs_captured"], meta["runs_left_out"]) == ("paused", 3, 0)
    exported = httpx.get(f"{web}/v1/_snapshots/{meta['id']}/export", timeout=60)
    assert exported.headers["content-disposition"] == f'attachment; filename="{meta["id"]}.json"'
    assert len(exported.content) == meta["byte_size"]
    envelope: dict[str, Any] = exported.json()
    return envelope


def test_paused_runs_move_to_a_second_instance_and_finish_there(stack: WorkerPool, web: str, instance_b: str) -> None:
    b = instance_b
    live = httpx.post(f"{web}/v1/_snapshots", json={}, timeout=30)  # loomcycle captures a running runtime too
    assert live.status_code == 201, live.text
    assert {k: live.json()[k] for k in ("runtime_state", "runs_captured")} == {
        "runtime_state": "running",
        "runs_captured": 0,
    }
    moved: list[Run] = []
    try:
        moved += _park_three_runs_and_pause()
        asking, waiting, between = moved
        assert wait_status(between.id, RunStatus.PAUSED).step == 1  # its first iteration committed, then it parked
        envelope = _capture_on_a(web)
        transcripts = {r.id: TranscriptEntry.objects.filter(run_id=r.id).count() for r in moved}
    finally:
        for run in moved:  # they live on B now: A cancels its copies, as an operator moving them would
            services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="moved to B")
        services.runtime_resume()
    captured = {e["run"]["id"]: e["run"]["status"] for e in envelope["sections"]["paused_runs"]["rows"]}
    assert captured == {asking.id: "awaiting_input", waiting.id: "waiting_channel", between.id: "paused"}

    # B is paused while it takes the snapshot in; its resume continues the runs.
    assert httpx.post(f"{b}/v1/_pause", json={}, timeout=60).json()["state"] == "paused"
    restored = httpx.post(f"{b}/v1/_snapshots/{envelope['id']}/restore", json={"json": envelope}, timeout=60)
    assert restored.status_code == 200, restored.text
    counts = restored.json()
    assert counts["paused_runs_restored"] == 3 and counts["paused_runs_resumed"] == 0
    assert counts["channel_waits_restored"] == 1
    assert counts["transcript_entries_restored"] == sum(transcripts.values())
    assert counts["agent_defs_restored"] == 0  # the same yaml on both: each def maps to B's own
    assert httpx.post(f"{b}/v1/_resume", timeout=30).json()["resumed_runs_count"] == 1

    publish = httpx.post(f"{b}/v1/_channels/handoff/publish", json={"payload": "go on B"}, timeout=30)
    assert publish.status_code in (200, 201), publish.text
    assert httpx.post(f"{b}/v1/runs/{asking.id}/input", json={"text": "second turn on B"}, timeout=30).is_success
    _assert_finished_on_b(b, asking, waiting, between)

    again = httpx.post(f"{b}/v1/_snapshots/{envelope['id']}/restore", json={"json": envelope}, timeout=60).json()
    assert set(again.values()) == {0}, again  # a second restore writes nothing
    _assert_refused(b, envelope)


def _status_on_b(b: str, run_id: str) -> str:
    return str(httpx.get(f"{b}/v1/runs/{run_id}", timeout=30).json()["status"])


def _assert_finished_on_b(b: str, asking: Run, waiting: Run, between: Run) -> None:
    wait_for(lambda: _status_on_b(b, between.id) == "completed", timeout=60)
    wait_for(lambda: _status_on_b(b, waiting.id) == "completed", timeout=60)
    wait_for(lambda: sum(e["type"] == "awaiting_input" for e in _events(b, asking.id)) == 2, timeout=60)
    # Each echo is the request B's model saw: the conversation begun on A, continued on B.
    seen = json.loads(_texts(b, between.id)[-1])
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant", "user"]
    assert seen["messages"][0]["text"].startswith("Move me.")
    seen = json.loads(_texts(b, waiting.id)[-1])
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant", "user"]
    (answer,) = [e for e in _events(b, waiting.id) if e["type"] == "tool_result"]
    assert "go on B" in json.dumps(answer["payload"])  # B's publish answered the wait parked on A
    seen = json.loads(_texts(b, asking.id)[-1])
    assert [(m["role"], m["text"].split(" MOCK_SCRIPT")[0]) for m in seen["messages"]] == [
        ("user", "Move me."),
        ("assistant", "first turn"),
        ("user", "second turn on B"),
    ]
    for run in (asking, waiting, between):  # A's events and B's, one gap-free sequence
        seqs = [e["seq"] for e in _events(b, run.id)]
        assert seqs == list(range(1, len(seqs) + 1))


def _assert_refused(b: str, envelope: dict[str, Any]) -> None:
    tampered = copy.deepcopy(envelope)
    tampered["sections"]["memory"]["rows"].append({"scope": "global", "key": "smuggled", "value": 1})
    answer = httpx.post(f"{b}/v1/_snapshots/{envelope['id']}/restore", json={"json": tampered}, timeout=60)
    assert (answer.status_code, answer.json()["code"]) == (422, "snapshot_checksum_mismatch")
    newer = copy.deepcopy(envelope)
    newer["sections"]["paused_runs"]["version"] = "1.2"
    newer["checksum"] = checksum_of(canonical(newer["sections"]))  # a well-formed envelope from a newer build
    answer = httpx.post(f"{b}/v1/_snapshots/{envelope['id']}/restore", json={"json": newer}, timeout=60)
    assert (answer.status_code, answer.json()["code"]) == (422, "snapshot_version_too_new")
    assert answer.json()["details"] == {"section": "paused_runs", "version": "1.2", "supported": "1.1"}
