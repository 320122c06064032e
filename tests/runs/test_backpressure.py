"""Admission backpressure (loomcycle's `concurrency` block), through real
Daphne web processes, Celery workers, beat, Postgres and Redis: a cap of 2
holds cluster-wide (two web processes and two workers), runs over it wait as
`waiting_slot` rows with no worker and start when a slot frees, a full queue
is 429 `backpressure` with Retry-After and no row, a streaming request waits
for its slot (429 `queue timeout` past `queue_timeout_ms`, leaving no run),
and beat promotes a waiting run whose promotion was lost."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import current_app

from apps.core.errors import Invalid
from apps.runs import backpressure
from apps.runs.models import TERMINAL, Run, RunStatus
from tests import procs
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

CAP, DEPTH, TIMEOUT_MS = 2, 3, 3000
CAP_ENV = {
    "LOOMCYCLE_MAX_CONCURRENT_RUNS": str(CAP),
    "LOOMCYCLE_MAX_QUEUE_DEPTH": str(DEPTH),
    "LOOMCYCLE_QUEUE_TIMEOUT_MS": str(TIMEOUT_MS),
}
DAPHNE = [sys.executable, "-m", "daphne", "-b", "127.0.0.1"]
QUEUE_FULL = {"code": "backpressure", "error": "queue full", "details": {}}


@pytest.fixture(scope="module")
def capped(workers: procs.WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[list[str]]:
    """Two Daphnes, two Celery workers and beat, all with the caps above in
    their environment; the session's workers and beat (no cap) are stopped
    meanwhile, so every admission decision and sweep here runs under the cap.
    Yields the two web base URLs."""
    workers.stop()
    workers.stop_beat()
    env = {**stack_env, **CAP_ENV}
    pool = procs.WorkerPool(env, logdir / "backpressure")
    pool.ensure()
    pool.start_beat()
    webs, bases = [], []
    for n in range(2):
        port = procs.free_port()
        argv = [*DAPHNE, "-p", str(port), "loomcycle_project.asgi:application"]
        webs.append(procs.spawn(argv, env, logdir / "backpressure" / f"daphne{n}.log"))
        bases.append(f"http://127.0.0.1:{port}")
    try:
        for base in bases:
            procs.wait_http(base + "/healthz")
        wait_for(lambda: len(current_app.control.ping(timeout=1) or []) >= len(pool.pids()), timeout=60)
        yield bases
    finally:
        for web in webs:
            procs.stop(web)
        pool.stop_beat()
        pool.stop()
        workers.ensure()
        workers.start_beat()


@pytest.fixture
def api(capped: list[str]) -> Iterator[httpx.Client]:
    """A client of the first web process; every run left live is cancelled after the test."""
    with httpx.Client(base_url=capped[0], timeout=30) as client:
        yield client
        _cancel_all(client)


def _cancel_all(client: httpx.Client) -> None:
    # Waiting runs first, so that cancelling an admitted one promotes nobody.
    for status in (RunStatus.WAITING_SLOT, None):
        live = Run.objects.exclude(status__in=TERMINAL)
        for agent_id in (live.filter(status=status) if status else live).values_list("agent_id", flat=True):
            client.post(f"/v1/agents/{agent_id}/cancel", json={})
    wait_for(lambda: not Run.objects.exclude(status__in=TERMINAL).exists(), timeout=30)


def post(client: httpx.Client, agent: str, agent_id: str, **extra: Any) -> httpx.Response:
    body = {"agent": agent, "prompt": "hi", "agent_id": agent_id, "background": True, **extra}
    return client.post("/v1/runs", json=body)


def fill_slots(client: httpx.Client) -> list[str]:
    """Two interactive runs that park at awaiting_input: they hold both slots and no worker."""
    ids = []
    for n in range(CAP):
        created = post(client, "chat", f"holder-{n}")
        assert created.status_code == 202 and created.json()["status"] == RunStatus.QUEUED, created.text
        ids.append(created.json()["run_id"])
    for run_id in ids:
        wait_status(run_id, RunStatus.AWAITING_INPUT)
    return ids


def max_overlap(runs: list[Run]) -> int:
    """The most runs that were running at one instant, from the rows' own
    Postgres timestamps (started_at: first claim; completed_at: final commit)."""
    edges = sorted([(r.started_at, 1) for r in runs] + [(r.completed_at, -1) for r in runs], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in edges:
        running += delta
        peak = max(peak, running)
    return peak


def test_cap_2_with_5_runs_never_runs_more_than_2_and_all_finish(api: httpx.Client, logdir: Path) -> None:
    created = [post(api, "stepper", f"step-{n}") for n in range(5)]
    assert [c.status_code for c in created] == [202] * 5, [c.text for c in created]
    assert [c.json()["status"] for c in created] == ["queued"] * 2 + ["waiting_slot"] * 3
    ids = [c.json()["run_id"] for c in created]
    assert Run.objects.filter(id__in=ids[2:], status=RunStatus.WAITING_SLOT, lease_until__isnull=True).count() == 3
    for run_id in ids:
        wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    runs = list(Run.objects.filter(id__in=ids))
    assert all(r.step == 5 and r.started_at and r.completed_at for r in runs)  # every iteration ran
    assert max_overlap(runs) == CAP  # the cap was used, never exceeded
    for n in (1, 2):  # by both worker processes (each one's finishes promote waiting runs)
        assert "runs.iterate[" in (logdir / "backpressure" / f"worker{n}.log").read_text()


def test_the_cap_holds_across_two_web_processes_creating_at_once(capped: list[str], api: httpx.Client) -> None:
    """Ten creations race across both web processes: exactly CAP are admitted,
    DEPTH wait, the rest are refused and leave no row."""
    clients = [httpx.Client(base_url=base, timeout=30) for base in capped]
    try:
        with ThreadPoolExecutor(max_workers=10) as ex:
            answers = list(ex.map(lambda n: post(clients[n % 2], "chat", f"race-{n}"), range(10)))
    finally:
        for c in clients:
            c.close()
    codes = sorted(a.status_code for a in answers)
    assert codes == [202] * (CAP + DEPTH) + [429] * (10 - CAP - DEPTH), [a.text for a in answers]
    statuses = sorted(a.json()["status"] for a in answers if a.status_code == 202)
    assert statuses == ["queued"] * CAP + ["waiting_slot"] * DEPTH
    assert Run.objects.count() == CAP + DEPTH
    refused = {a.json()["agent_id"] for a in answers if a.status_code == 202} ^ {f"race-{n}" for n in range(10)}
    assert not Run.objects.filter(agent_id__in=refused).exists()


def test_a_full_queue_is_429_backpressure_with_retry_after_and_no_run_row(api: httpx.Client) -> None:
    fill_slots(api)
    waiting = [post(api, "echo", f"wait-{n}") for n in range(DEPTH)]
    assert [w.json()["status"] for w in waiting] == ["waiting_slot"] * DEPTH
    stats = api.get("/v1/_concurrency/stats").json()
    assert (stats["active"], stats["queued"]) == (CAP, DEPTH)
    for extra in ({}, {"background": False}):  # background, and a streaming request: refused before the stream
        refused = post(api, "echo", "over-the-top", **extra)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "5", refused.text
        assert refused.json() == QUEUE_FULL
    assert not Run.objects.filter(agent_id="over-the-top").exists()
    assert Run.objects.count() == CAP + DEPTH


def test_a_freed_slot_starts_the_oldest_waiting_run(api: httpx.Client) -> None:
    holders = fill_slots(api)
    waiting = [post(api, "echo", f"fifo-{n}").json() for n in range(2)]
    assert [w["status"] for w in waiting] == ["waiting_slot"] * 2
    first, second = (w["run_id"] for w in waiting)
    api.post("/v1/agents/holder-0/cancel", json={})  # one slot frees: the oldest waiting run starts
    a, b = (wait_status(run_id, RunStatus.COMPLETED) for run_id in (first, second))
    assert a.completed_at < b.started_at  # the slot was first's until it ended, then second's
    assert Run.objects.get(id=holders[1]).status == RunStatus.AWAITING_INPUT


def _stream(client: httpx.Client, body: dict[str, Any], opened: threading.Event, out: dict[str, Any]) -> None:
    with client.stream("POST", "/v1/runs", json=body) as response:
        opened.set()
        out["status"] = response.status_code
        out["events"] = [line[len("event: ") :] for line in response.iter_lines() if line.startswith("event: ")]


def test_a_streaming_request_waits_for_its_slot_then_streams(api: httpx.Client) -> None:
    fill_slots(api)
    opened, out = threading.Event(), {}
    body = {"agent": "echo", "prompt": "hi", "agent_id": "streamer"}
    with httpx.Client(base_url=str(api.base_url), timeout=30) as other:
        reader = threading.Thread(target=_stream, args=(other, body, opened, out))
        reader.start()
        row = wait_for(lambda: Run.objects.filter(agent_id="streamer").first())
        assert row.status == RunStatus.WAITING_SLOT and not opened.is_set()  # held before the stream opens
        api.post("/v1/agents/holder-1/cancel", json={})
        reader.join(timeout=30)
    assert out["status"] == 200 and out["events"][:2] == ["session", "agent"] and out["events"][-1] == "done"
    assert Run.objects.get(agent_id="streamer").status == RunStatus.COMPLETED


def test_a_streaming_request_past_queue_timeout_is_429_and_leaves_no_run(api: httpx.Client) -> None:
    fill_slots(api)
    t0 = time.monotonic()
    refused = api.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "agent_id": "too-late"})
    waited = time.monotonic() - t0
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "5", refused.text
    assert refused.json() == {"code": "backpressure", "error": "queue timeout", "details": {}}
    assert TIMEOUT_MS / 1000 <= waited < TIMEOUT_MS / 1000 + 5
    assert not Run.objects.filter(agent_id="too-late").exists()
    retried = post(api, "echo", "too-late")  # its agent_id is free again, and the queue place too
    assert retried.status_code == 202 and retried.json()["status"] == "waiting_slot"


def test_a_client_that_leaves_while_waiting_withdraws_its_run(api: httpx.Client) -> None:
    """As loomcycle frees a queued request's place when its client disconnects:
    the row goes at the hang-up (1 s), well before the queue timeout (3 s)."""
    fill_slots(api)
    t0 = time.monotonic()
    with httpx.Client(base_url=str(api.base_url), timeout=httpx.Timeout(30, read=1.0)) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "agent_id": "gone"})
    assert Run.objects.filter(agent_id="gone").exists() or time.monotonic() - t0 < 1.5
    left = TIMEOUT_MS / 1000 - 0.5 - (time.monotonic() - t0)
    assert wait_for(lambda: not Run.objects.filter(agent_id="gone").exists(), timeout=left)


def test_beat_starts_a_waiting_run_whose_promotion_was_lost(api: httpx.Client) -> None:
    holders = fill_slots(api)
    stranded = post(api, "echo", "stranded").json()
    assert stranded["status"] == "waiting_slot"
    waiting = stranded["run_id"]
    # A holder ends without anyone promoting (as if its process died right after its commit).
    Run.objects.filter(id=holders[0]).update(status=RunStatus.COMPLETED)
    wait_status(waiting, RunStatus.COMPLETED, timeout=15)  # beat's admission sweep, every second in tests


def test_concurrency_yaml_wins_over_the_environment(settings: Any, tmp_path: Path) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs=9, queue_timeout_ms=9)
    cfg = tmp_path / "bp.yaml"
    cfg.write_text("concurrency:\n  max_concurrent_runs: 3\n  max_queue_depth: ${BP_TEST_DEPTH:-0}\n")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(cfg),))
    assert backpressure.limits() == backpressure.Limits(max_concurrent_runs=3, max_queue_depth=0, queue_timeout_ms=9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("concurrency:\n  queue_timeout_ms: soon\n")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(bad),))
    with pytest.raises(Invalid) as info:
        backpressure.limits()
    assert info.value.code == "config_invalid"
    assert json.loads(json.dumps(backpressure.Backpressure("queue full").body())) == QUEUE_FULL
