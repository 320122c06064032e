"""`python -m loomcycle_project.healthcheck` (compose's healthchecks) against the real
processes of the suite: the session's web, workers and beat, and a Flower started here
the way compose starts it (basic auth from the environment)."""

from __future__ import annotations

import base64
import dataclasses
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.core.redis import sync_client
from loomcycle_project import healthcheck
from tests import procs
from tests.conftest import wait_for
from workers.held import PRESENCE_PREFIX


def check(kind: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "loomcycle_project.healthcheck", kind, *args]
    return subprocess.run(argv, env=env, cwd=procs.ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_web_is_healthy_while_its_healthz_says_ok(web: str, stack_env: dict[str, str]) -> None:
    done = check("web", stack_env, "--url", f"{web}/healthz")
    assert (done.returncode, done.stdout.strip()) == (0, f"{web}/healthz: ok"), done.stderr
    with pytest.raises(healthcheck.Unhealthy, match=r"^http://127\.0\.0\.1:\d+/healthz: "):
        healthcheck.check_web(f"http://127.0.0.1:{procs.free_port()}/healthz")  # nothing listens there


def test_the_web_check_targets_the_listen_port_and_an_allowed_host_name(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, listen_addr="0.0.0.0:9999")
    assert healthcheck.web_url() == "http://127.0.0.1:9999/healthz"
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, listen_addr="10.1.2.3:8787")
    assert healthcheck.web_url() == "http://10.1.2.3:8787/healthz"
    settings.ALLOWED_HOSTS = [".lc.example", "other.example"]
    assert healthcheck.web_host() == "lc.example"
    settings.ALLOWED_HOSTS = ["*"]
    assert healthcheck.web_host() is None


def test_a_worker_is_healthy_while_a_live_process_of_this_host_keeps_its_presence_key(
    stack: procs.WorkerPool, stack_env: dict[str, str]
) -> None:
    def ready() -> set[int]:  # workers write their key once ready (workers/signals.py)
        keys = sync_client().scan_iter(f"{PRESENCE_PREFIX}{healthcheck.host_name()}:*")
        return {int(k.decode().split(":")[3]) for k in keys} & set(stack.pids())

    wait_for(lambda: ready() == set(stack.pids()), timeout=30)
    done = check("worker", stack_env)
    assert done.returncode == 0, done.stderr
    listed = {int(entry.split(":")[1]) for entry in done.stdout.strip().removeprefix("worker presence: ").split(", ")}
    assert listed <= set(stack.pids()) and listed, (listed, stack.pids())


def test_a_presence_key_of_a_dead_process_is_not_a_healthy_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    host = f"hc-{secrets.token_hex(4)}"
    monkeypatch.setattr(healthcheck, "host_name", lambda: host)
    with pytest.raises(healthcheck.Unhealthy, match="no live worker process of this host"):
        healthcheck.check_worker(None)
    dead = subprocess.Popen(["true"])  # a process that has exited: its pid names no live process
    dead.wait()
    keys = [f"{PRESENCE_PREFIX}{host}:{dead.pid}:aaaa", f"{PRESENCE_PREFIX}{host}:{os.getpid()}:bbbb"]
    client = sync_client()
    try:
        client.set(keys[0], f'{{"pid": {dead.pid}}}', ex=30)
        with pytest.raises(healthcheck.Unhealthy):
            healthcheck.check_worker(None)
        client.set(keys[1], f'{{"pid": {os.getpid()}}}', ex=30)
        assert healthcheck.check_worker(None) == f"worker presence: {host}:{os.getpid()}:bbbb"
    finally:
        client.delete(*keys)


def test_beat_is_healthy_while_its_tick_loop_keeps_the_heartbeat_file_fresh(
    stack: procs.WorkerPool, stack_env: dict[str, str], settings: Any
) -> None:
    path = Path(settings.LOOMCYCLE.beat_heartbeat_file)
    first = wait_for(lambda: path.exists() and path.stat().st_mtime_ns)
    wait_for(lambda: path.stat().st_mtime_ns > first, timeout=5 * settings.LOOMCYCLE.heartbeat_seconds)
    done = check("beat", stack_env)
    assert done.returncode == 0 and done.stdout.startswith("beat heartbeat "), done.stderr


def test_a_missing_or_stale_heartbeat_file_is_an_unhealthy_beat(settings: Any, tmp_path: Path) -> None:
    path = tmp_path / "beat-heartbeat"
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, beat_heartbeat_file=str(path), heartbeat_seconds=10)
    with pytest.raises(healthcheck.Unhealthy, match="No such file"):
        healthcheck.check_beat(None)
    path.touch()
    old = time.time() - 31
    os.utime(path, (old, old))
    with pytest.raises(healthcheck.Unhealthy, match=r"is 31 s old \(more than 30 s\)"):
        healthcheck.check_beat(None)
    path.touch()
    assert healthcheck.check_beat(None).startswith("beat heartbeat 0.")


@pytest.fixture
def flower(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """Flower as compose starts it: basic auth from FLOWER_BASIC_AUTH, kombu's stock transport."""
    port = procs.free_port()
    env = {**stack_env, "FLOWER_BASIC_AUTH": "ops:s3cret", "LOOMCYCLE_FAST_TRANSPORT": "0"}
    argv = [*procs.CELERY, "flower", f"--port={port}", "--address=127.0.0.1"]
    proc = procs.spawn(argv, env, logdir / "flower-healthcheck.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthcheck", timeout=60)
        yield base
    finally:
        procs.stop(proc)


def test_flower_asks_for_basic_auth_and_its_healthcheck_does_not(flower: str, stack_env: dict[str, str]) -> None:
    assert httpx.get(flower + "/workers", timeout=10).status_code == 401
    token = base64.b64encode(b"ops:s3cret").decode()
    assert httpx.get(flower + "/workers", headers={"authorization": f"Basic {token}"}, timeout=10).status_code == 200
    done = check("flower", stack_env, "--url", f"{flower}/healthcheck")
    assert (done.returncode, done.stdout.strip()) == (0, f"{flower}/healthcheck: OK"), done.stderr
