"""`python -m loomcycle_project.healthcheck` (compose's healthchecks) against the real
processes of the suite: the session's web, workers and beat, and a Flower started here
the way compose starts it (basic auth from the environment). And /healthz itself: opaque
`{ok}` to anyone but an admin, 503 when a service is out of reach, and answered off
Django's one sync thread."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, transaction
from django.test import Client

from apps.core.redis import sync_client
from apps.substrate import tokens
from loomcycle_project import health, healthcheck
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


# --- /healthz ----------------------------------------------------------------------------------

DETAILS = {
    "version",
    "uptime_seconds",
    "postgres",
    "redis",
    "workers",
    "metrics_enabled",
    "replica_id",
    "replicas",
    "grpc",
}


def _admin_bearer() -> dict[str, str]:
    token = tokens.token_create(name="hz-admin", tenant_id="ops", scopes=["substrate:admin"])["token"]
    return {"authorization": f"Bearer {token}"}


@pytest.mark.usefixtures("transactional_db")
def test_healthz_tells_anyone_but_an_admin_only_ok(web: str, people: dict[str, dict[str, str]]) -> None:
    """Tokens exist (no open mode): anonymous, unknown and tenant bearers get `{"ok": true}` and
    nothing else (no host, pid, version or error text); an admin bearer gets the details."""
    admin = _admin_bearer()
    callers = {"anonymous": {}, "unknown": {"authorization": "Bearer not-a-token"}, "tenant": people["alice"]}
    for who, headers in callers.items():
        resp = httpx.get(f"{web}/healthz", headers=headers, timeout=30)
        assert (resp.status_code, resp.json()) == (200, {"ok": True}), who
    detailed = httpx.get(f"{web}/healthz", headers=admin, timeout=30)
    assert detailed.status_code == 200 and set(detailed.json()) == {"ok", *DETAILS}
    assert detailed.json()["postgres"]["ok"] and any(r["kind"] == "web" for r in detailed.json()["replicas"])


@pytest.mark.django_db
def test_the_open_mode_principal_gets_the_details_and_a_remote_caller_does_not(client: Client) -> None:
    assert set(client.get("/healthz", REMOTE_ADDR="127.0.0.1").json()) == {"ok", *DETAILS}
    remote = client.get("/healthz", REMOTE_ADDR="192.0.2.10")  # open mode serves loopback only
    assert (remote.status_code, remote.json()) == (200, {"ok": True})


@contextlib.contextmanager
def web_with_redis_at(stack_env: dict[str, str], logdir: Path, redis_url: str, name: str) -> Iterator[str]:
    """A web process whose Redis is `redis_url`, with a legacy admin token (no open mode)."""
    port = procs.free_port()
    env = {**stack_env, "REDIS_URL": redis_url, "LOOMCYCLE_AUTH_TOKEN": "hz-legacy-admin-token"}
    proc = procs.spawn(procs.web_argv(port), env, logdir / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/v1/openapi.json", timeout=90)  # /healthz is a 503 here by design
        yield base
    finally:
        procs.stop(proc)


@pytest.mark.usefixtures("transactional_db")
def test_a_service_out_of_reach_is_a_503_whose_reason_only_an_admin_reads(
    stack_env: dict[str, str], logdir: Path
) -> None:
    refused = f"redis://127.0.0.1:{procs.free_port()}/0"  # nothing listens there
    with web_with_redis_at(stack_env, logdir, refused, "daphne-redis-refused") as base:
        anonymous = httpx.get(f"{base}/healthz", timeout=30)
        admin = {"authorization": "Bearer hz-legacy-admin-token"}
        detailed = httpx.get(f"{base}/healthz", headers=admin, timeout=60)
        with pytest.raises(healthcheck.Unhealthy, match="ok is false"):
            healthcheck.check_web(f"{base}/healthz")
    assert (anonymous.status_code, anonymous.json()) == (503, {"ok": False})  # no Redis error text
    body = detailed.json()
    assert detailed.status_code == 503 and body["ok"] is False
    assert body["postgres"]["ok"] is True and body["redis"]["ok"] is False and body["redis"]["error"]
    assert body["replicas"] == []


def test_a_hung_service_makes_healthz_a_503_within_its_bound(stack_env: dict[str, str], logdir: Path) -> None:
    """A Redis that accepts connections and never answers: the probe still answers, within
    the check's bound (the compose healthcheck gives up after 5 s)."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as hole:  # never accepted: no byte comes back
        url = f"redis://127.0.0.1:{hole.getsockname()[1]}/0"
        with web_with_redis_at(stack_env, logdir, url, "daphne-redis-hung") as base:
            started = time.monotonic()
            resp = httpx.get(f"{base}/healthz", timeout=20)
            elapsed = time.monotonic() - started
    assert (resp.status_code, resp.json()) == (503, {"ok": False})
    assert elapsed < health.CHECK_TIMEOUT_S + 2, elapsed


def _waiting_on_runs() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE c.relname = 'runs_run' AND NOT l.granted"
        )
        return bool(cur.fetchone()[0])


@pytest.mark.usefixtures("transactional_db")
def test_healthz_answers_while_a_sync_view_is_stuck(web: str) -> None:
    """A sync API view (GET /v1/runs/{id}) stuck on a table lock holds a sync thread; /healthz,
    anonymous and admin, still answers at once. (A guard: Django's ASGI handler already gives
    each request its own thread-sensitive executor, so this held before /healthz was async.)"""
    admin = _admin_bearer()
    held: list[int] = []
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("LOCK TABLE runs_run IN ACCESS EXCLUSIVE MODE")
        stuck = threading.Thread(
            target=lambda: held.append(
                httpx.get(f"{web}/v1/runs/r_0000000000000000", headers=admin, timeout=60).status_code
            )
        )
        stuck.start()
        wait_for(_waiting_on_runs, timeout=30)  # the sync view now waits on the lock, on the sync thread
        started = time.monotonic()
        anonymous = httpx.get(f"{web}/healthz", timeout=10)
        detailed = httpx.get(f"{web}/healthz", headers=admin, timeout=10)
        elapsed = time.monotonic() - started
    stuck.join(60)
    assert (anonymous.status_code, anonymous.json()) == (200, {"ok": True})
    assert detailed.status_code == 200 and detailed.json()["postgres"]["ok"] is True
    assert elapsed < 5, elapsed
    assert held == [404]  # the held view answered once the lock was released
