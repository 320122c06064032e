"""Fairness (SPEC 9.6) across processes, through the real Redis and Postgres:
per-user and per-tenant admission of runs, gateway call slots, the provider
gate, release on finish and on cancel, reconciliation by the beat sweeper,
`GET /v1/_concurrency/stats`, and a per-user cap of 1 that holds cluster-wide
(two OS processes racing; a Daphne web process and Celery workers)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import current_app
from django.test import Client

from apps.core.errors import Conflict, Invalid
from apps.core.redis import sync_client
from apps.gateway import fairness
from apps.gateway.fairness.config import PREFIX, RUNS_KEY
from apps.gateway.providers import ProviderCancelled, registry
from apps.runs import engine, services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.substrate import tokens
from tests import procs
from tests.conftest import ALICE, wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

CAP_ENV = {"LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "1"}
OVER_CAP_U1 = {
    "code": "per_user_quota_exhausted",
    "error": "per-user quota exhausted: user=u1 cap=1",
    "user_id": "u1",
    "cap": 1,
    "details": {"user_id": "u1", "cap": 1},
}


def fair_keys() -> list[bytes]:
    return list(sync_client().scan_iter(match=PREFIX + "*", count=1000))


@pytest.fixture(autouse=True)
def clean_slots() -> Iterator[None]:
    """Each test starts and ends with no slot held (the test database is emptied too)."""
    for key in fair_keys():
        sync_client().delete(key)
    yield
    for key in fair_keys():
        sync_client().delete(key)


@pytest.fixture
def cap(settings: Any) -> Any:
    """Set this process's caps as the environment would (yaml sets none in tests)."""

    def set_caps(per_user: int = 0, per_tenant: int = 0, queue_timeout_ms: int = 30_000) -> None:
        settings.LOOMCYCLE = dataclasses.replace(
            settings.LOOMCYCLE,
            max_concurrent_runs_per_user=per_user,
            max_concurrent_runs_per_tenant=per_tenant,
            provider_queue_timeout_ms=queue_timeout_ms,
        )

    return set_caps


def held(user: str, tenant: str = "") -> int:
    return int(sync_client().zcard(f"{PREFIX}u:{tenant}/{user}"))


def start(agent: str, user_id: str, **kw: Any) -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text="hi")], user_id=user_id, **kw)
    return services.run_create(principal=ALICE, data=data)


def child_env(stack_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**stack_env, "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings", **extra}


# --- configuration -----------------------------------------------------------------------

_CAPS_PROBE = """
import dataclasses, json, django
django.setup()
from django.conf import settings
from apps.gateway import fairness
caps = fairness.caps()
out = {"caps": [caps.per_user, caps.per_tenant, caps.provider_queue_timeout_ms]}
# Redis here is a closed port: with every cap 0, nothing below may touch it.
settings.LOOMCYCLE = dataclasses.replace(
    settings.LOOMCYCLE, max_concurrent_runs_per_user=0, max_concurrent_runs_per_tenant=0
)
fairness.run_slot_take(run_id="r_probe", tenant_id="t", user_id="u")
fairness.run_slot_release("r_probe")
with fairness.call_slot("t", "u"), fairness.provider_slot("mock"):
    out["off_ok"] = True
settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs_per_user=1)
try:
    fairness.run_slot_take(run_id="r_probe", tenant_id="t", user_id="u")
except fairness.FairnessUnavailable as exc:
    out["on"] = [exc.status, exc.code]
print(json.dumps(out))
"""


def test_caps_come_from_the_environment_and_cap_zero_never_touches_redis(stack_env: dict[str, str]) -> None:
    env = child_env(
        stack_env,
        LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER="3",
        LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT="7",
        LOOMCYCLE_PROVIDER_QUEUE_TIMEOUT_MS="1234",
        REDIS_URL=f"redis://127.0.0.1:{procs.free_port()}/0",
    )
    done = subprocess.run(
        [sys.executable, "-c", _CAPS_PROBE], env=env, cwd=procs.ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out == {"caps": [3, 7, 1234], "off_ok": True, "on": [503, "store_unavailable"]}


def test_yaml_concurrency_block_wins_over_the_environment(settings: Any, tmp_path: Path, cap: Any) -> None:
    cap(per_user=9, per_tenant=9, queue_timeout_ms=9)
    cfg = tmp_path / "fair.yaml"
    cfg.write_text(
        "concurrency:\n  max_concurrent_runs_per_user: 2\n"
        "  max_concurrent_runs_per_tenant: ${FAIR_TEST_TENANT_CAP:-5}\n"
    )
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(cfg),))
    assert fairness.caps() == fairness.Caps(per_user=2, per_tenant=5, provider_queue_timeout_ms=9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("concurrency:\n  max_concurrent_runs_per_user: -1\n")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(bad),))
    with pytest.raises(Invalid) as info:
        fairness.caps()
    assert info.value.code == "config_invalid"


# --- admission over HTTP (in-process web) ------------------------------------------------------


@pytest.fixture
def web_client(settings: Any) -> Client:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token=None)  # open mode, loopback
    return Client()


def post_run(client: Client, user_id: str | None, agent: str = "slow") -> Any:
    body: dict[str, Any] = {"agent": agent, "prompt": "hi", "background": True}
    if user_id is not None:
        body["user_id"] = user_id
    return client.post("/v1/runs", data=body, content_type="application/json")


def test_over_the_per_user_cap_post_runs_is_429_with_loomcycle_body(web_client: Client, cap: Any) -> None:
    cap(per_user=1)
    first = post_run(web_client, "u1")
    assert first.status_code == 202, first.content
    refused = post_run(web_client, "u1", agent="echo")
    assert refused.status_code == 429
    assert refused.json() == OVER_CAP_U1
    assert refused["Retry-After"] == "5"
    assert Run.objects.filter(user_id="u1").count() == 1  # the refused run left no row
    assert post_run(web_client, "u2").status_code == 202  # another user is admitted
    assert post_run(web_client, None).status_code == 202  # an empty user_id is not capped
    assert post_run(web_client, None).status_code == 202
    assert (held("u1"), held("u2")) == (1, 1)


def test_over_the_per_tenant_cap_post_runs_is_429(web_client: Client, cap: Any) -> None:
    cap(per_tenant=2)
    assert post_run(web_client, "u1").status_code == 202
    assert post_run(web_client, None).status_code == 202
    refused = post_run(web_client, "u3")
    assert refused.status_code == 429 and refused["Retry-After"] == "5"
    assert refused.json() == {
        "code": "per_tenant_quota_exhausted",
        "error": "per-tenant quota exhausted: tenant= cap=2",
        "tenant_id": "",
        "cap": 2,
        "details": {"tenant_id": "", "cap": 2},
    }


def test_a_create_that_fails_after_admission_gives_its_slot_back(cap: Any) -> None:
    cap(per_user=1)
    start("slow", "u1", agent_id="taken")
    with pytest.raises(Conflict):
        start("slow", "u2", agent_id="taken")  # admitted, then the unique agent_id refuses the row
    assert (held("u1"), held("u2")) == (1, 0)
    assert start("slow", "u2").user_id == "u2"


def test_stats_report_live_runs_and_held_slots(web_client: Client, cap: Any) -> None:
    cap(per_user=2, per_tenant=5)
    start("slow", "u1")
    start("slow", "u1")
    with fairness.call_slot("acme", "bob"):
        stats = web_client.get("/v1/_concurrency/stats")
    assert stats.status_code == 200, stats.content
    body = stats.json()
    assert body["per_user"] == {"u1": 2, "acme/bob": 1}
    assert body["per_tenant"] == {"": 2, "acme": 1}
    assert body["caps"] == {"per_user": 2, "per_tenant": 5}
    assert body["active"] + body["queued"] == 2 and body["providers"] == {}
    after = web_client.get("/v1/_concurrency/stats").json()
    assert after["per_user"] == {"u1": 2} and after["per_tenant"] == {"": 2}


def test_stats_need_the_admin_scope(web_client: Client) -> None:
    tenant_token = tokens.token_create(name="tenant-op", tenant_id="acme", scopes=["substrate:tenant"])["token"]
    denied = web_client.get("/v1/_concurrency/stats", headers={"Authorization": f"Bearer {tenant_token}"})
    assert denied.status_code == 403
    assert denied["WWW-Authenticate"] == 'Bearer scope="substrate:admin"'


# --- gateway call slots ------------------------------------------------------------------------


def test_gateway_calls_count_against_the_same_per_user_cap_as_runs(cap: Any) -> None:
    cap(per_user=1)
    start("slow", "u1")
    with pytest.raises(fairness.SlotRefused) as info, fairness.call_slot("", "u1"):
        pytest.fail("a call must not be admitted over the cap")
    assert info.value.body() == OVER_CAP_U1 and info.value.headers == {"Retry-After": "5"}
    with fairness.call_slot("", "u2"):
        assert held("u2") == 1
        with pytest.raises(fairness.SlotRefused):
            start("echo", "u2")
    assert held("u2") == 0
    with pytest.raises(RuntimeError), fairness.call_slot("", "u2"):
        raise RuntimeError("the call failed")
    assert held("u2") == 0  # released on the way out of a failed call too


def test_async_gateway_call_slots(cap: Any) -> None:
    cap(per_user=1)

    async def scenario() -> tuple[int, str, int]:
        async with fairness.acall_slot("acme", "u1"):
            inside = held("u1", "acme")
            try:
                async with fairness.acall_slot("acme", "u1"):
                    raise AssertionError("a second slot was granted over the cap of 1")
            except fairness.SlotRefused as exc:
                code = exc.code
        return inside, code, held("u1", "acme")

    assert asyncio.run(scenario()) == (1, "per_user_quota_exhausted", 0)


def test_held_call_slots_are_refreshed_and_a_dead_holders_slot_expires(
    cap: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap(per_user=1)
    monkeypatch.setattr(fairness.store, "CALL_TTL_MS", 600)
    monkeypatch.setattr(fairness.store, "HEARTBEAT_S", 0.1)
    fairness.store.HEARTBEAT._pid = 0  # the next hold starts a heartbeat thread with the short period
    with fairness.call_slot("", "u1"):
        time.sleep(1.5)  # well past the TTL: only the heartbeat keeps it
        assert held("u1") == 1
    # A holder that died: its slot is not refreshed and expires by itself.
    assert fairness.store.take(fairness.config.user_gates("", "u1"), "c_dead", 600) is None
    with pytest.raises(fairness.SlotRefused):
        fairness.run_slot_take(run_id="r_x", tenant_id="", user_id="u1")
    time.sleep(0.8)
    fairness.run_slot_take(run_id="r_x", tenant_id="", user_id="u1")


# --- the provider gate ---------------------------------------------------------------------------


@pytest.fixture
def gated_provider(settings: Any, tmp_path: Path) -> Iterator[str]:
    """A yaml provider with `max_concurrent: 1` (never called: only its gate is used)."""
    cfg = tmp_path / "providers.yaml"
    cfg.write_text(
        "providers:\n  gated:\n    driver: openai\n    base_url: http://127.0.0.1:9/v1\n    max_concurrent: 1\n"
    )
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, config_files=(*settings.LOOMCYCLE.config_files, str(cfg))
    )
    registry._providers.cache_clear()
    yield "gated"
    registry._providers.cache_clear()


def _wait_for_slot(
    provider: str, outcome: dict[str, Any], cancel: threading.Event | None = None, cap: int | None = None
) -> None:
    t0 = time.monotonic()
    try:
        with fairness.provider_slot(provider, cap, cancel=cancel):
            outcome["got"] = time.monotonic() - t0
    except (fairness.SlotRefused, ProviderCancelled) as exc:
        outcome["error"], outcome["after"] = exc, time.monotonic() - t0


def test_provider_gate_waits_then_refuses_with_429(gated_provider: str, cap: Any) -> None:
    cap(queue_timeout_ms=600)
    assert fairness.provider_cap(gated_provider) == 1 and fairness.provider_cap("mock") == 0
    outcome: dict[str, Any] = {}
    with fairness.provider_slot(gated_provider):
        waiter = threading.Thread(target=_wait_for_slot, args=(gated_provider, outcome))
        waiter.start()
        time.sleep(0.3)
        assert fairness.slots_stats()["providers"] == {gated_provider: {"active": 1, "queued": 1, "cap": 1}}
        waiter.join(5)
    error = outcome["error"]
    assert isinstance(error, fairness.SlotRefused) and 0.55 <= outcome["after"] < 2
    assert error.status == 429 and error.headers == {"Retry-After": "5"}
    assert error.body() == {
        "code": "provider_concurrency_exhausted",
        "error": "provider concurrency exhausted: provider=gated cap=1",
        "provider": "gated",
        "cap": 1,
        "details": {"provider": "gated", "cap": 1},
    }
    assert fairness.slots_stats()["providers"] == {gated_provider: {"active": 0, "queued": 0, "cap": 1}}


def test_provider_gate_admits_a_waiter_when_the_holder_releases(cap: Any) -> None:
    cap(queue_timeout_ms=5_000)
    outcome: dict[str, Any] = {}
    with fairness.provider_slot("mock", cap=1):
        waiter = threading.Thread(target=_wait_for_slot, args=("mock", outcome, None, 1))
        waiter.start()
        time.sleep(0.3)
    waiter.join(5)
    assert "error" not in outcome and 0.25 <= outcome["got"] < 2


def test_cancel_while_waiting_for_a_provider_raises_provider_cancelled(cap: Any) -> None:
    cap(queue_timeout_ms=10_000)
    outcome: dict[str, Any] = {}
    cancel = threading.Event()
    with fairness.provider_slot("mock", cap=1):
        waiter = threading.Thread(target=_wait_for_slot, args=("mock", outcome, cancel, 1))
        waiter.start()
        time.sleep(0.2)
        cancel.set()
        waiter.join(5)
    assert isinstance(outcome["error"], ProviderCancelled) and outcome["after"] < 1


def test_async_provider_gate_times_out_then_admits(cap: Any) -> None:
    cap(queue_timeout_ms=300)

    async def scenario() -> tuple[str, float]:
        async with fairness.aprovider_slot("mock", cap=1):
            t0 = time.monotonic()
            try:
                async with fairness.aprovider_slot("mock", cap=1):
                    return "admitted", 0.0
            except fairness.SlotRefused as exc:
                refused = (exc.code, time.monotonic() - t0)
        async with fairness.aprovider_slot("mock", cap=1):
            return refused

    code, waited = asyncio.run(scenario())
    assert code == "provider_concurrency_exhausted" and 0.28 <= waited < 2


# --- a per-user cap of 1 holds cluster-wide ------------------------------------------------------

_RACER = """
import json, os, sys, time
import django
django.setup()
from apps.core.redis import sync_client
from apps.gateway import fairness
r = sync_client()
mode, rounds = sys.argv[1], int(sys.argv[2])
r.incr("lc:fair:test:ready")
while not r.exists("lc:fair:test:go"):
    time.sleep(0.002)
held = refused = overlaps = 0
def critical():
    global held, overlaps
    if r.incr("lc:fair:test:holders") > 1:
        overlaps += 1
    time.sleep(0.001)
    r.decr("lc:fair:test:holders")
    held += 1
for i in range(rounds):
    try:
        if mode == "runs":
            run_id = f"r_{os.getpid()}_{i}"
            fairness.run_slot_take(run_id=run_id, tenant_id="acme", user_id="racer")
            try:
                critical()
            finally:
                fairness.run_slot_release(run_id)
        else:
            with fairness.call_slot("acme", "racer"):
                critical()
    except fairness.SlotRefused:
        refused += 1
print(json.dumps({"held": held, "refused": refused, "overlaps": overlaps}))
"""


def test_fairness_across_two_worker_processes_a_per_user_cap_of_1_holds_cluster_wide(
    stack_env: dict[str, str],
) -> None:
    env = child_env(stack_env, **CAP_ENV)
    sync_client().delete("lc:fair:test:ready", "lc:fair:test:go")
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, mode, "400"],
            env=env,
            cwd=procs.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for mode in ("runs", "calls", "runs")
    ]
    wait_for(lambda: int(sync_client().get("lc:fair:test:ready") or 0) == 3, timeout=60)  # all at the starting line
    sync_client().set("lc:fair:test:go", "1")
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err.decode()[-3000:]
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert [r["overlaps"] for r in results] == [0, 0, 0]  # never two holders at once
    assert all(r["held"] > 0 for r in results)  # each process got the slot some of the time
    assert sum(r["refused"] for r in results) > 0  # ... and they really raced for it
    assert held("racer", "acme") == 0 and sync_client().hlen(RUNS_KEY) == 0


# --- release, cancel and reconciliation against real workers -----------------------------------


@pytest.fixture(scope="module")
def fair_stack(workers: procs.WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[tuple[str, Any]]:
    """Daphne and two Celery workers with a per-user cap of 1 in their environment.
    The session's workers (cap 0) are stopped meanwhile so that every run here
    is executed under the cap; the session beat keeps ringing the sweepers."""
    workers.stop()
    env = {**stack_env, **CAP_ENV}
    pool = procs.WorkerPool(env, logdir / "fairness")
    pool.ensure()
    port = procs.free_port()
    daphne = procs.web_argv(port)
    web = procs.spawn(daphne, env, logdir / "fairness" / "daphne.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthz")
        # Ready workers only: a consumer cancelled before its worker is up would still consume.
        wait_for(lambda: len(current_app.control.ping(timeout=1) or []) >= len(pool.pids()), timeout=60)
        yield base, pool
    finally:
        procs.stop(web)
        pool.stop()
        workers.ensure()


@contextmanager
def consumers_paused(pool: procs.WorkerPool, *queues: str) -> Iterator[None]:
    """No worker takes from these queues meanwhile (messages wait in the broker)."""
    n = len(pool.pids())
    for queue in queues:
        current_app.control.cancel_consumer(queue, reply=True, timeout=5, limit=n)
    try:
        yield
    finally:
        for queue in queues:
            current_app.control.add_consumer(queue, reply=True, timeout=5, limit=n)


def test_the_engine_releases_the_slot_when_a_run_finishes(fair_stack: tuple[str, Any], cap: Any) -> None:
    cap(per_user=1)
    with consumers_paused(fair_stack[1], "runs", "maintenance"):  # no worker, no sweeper: only the engine
        run = start("echo", "u1")
        assert held("u1") == 1
        assert engine.run_iterate(run_id=run.id, step=0) == "finish"
        assert Run.objects.get(id=run.id).status == RunStatus.COMPLETED
        assert held("u1") == 0 and not sync_client().hexists(RUNS_KEY, run.id)
        engine_free = start("echo", "u1")  # admitted again
    wait_status(engine_free.id, RunStatus.COMPLETED)


def test_cancel_releases_the_slot_queued_or_running(fair_stack: tuple[str, Any], cap: Any) -> None:
    cap(per_user=1)
    pool = fair_stack[1]
    with consumers_paused(pool, "runs", "maintenance"):  # a queued run: cancel finishes it right there
        queued = start("slow", "u1")
        services.run_cancel(principal=ALICE, agent_id=queued.agent_id)
        assert Run.objects.get(id=queued.id).status == RunStatus.CANCELLED
        assert held("u1") == 0
    with consumers_paused(pool, "maintenance"):  # a running run: its worker finishes it
        running = start("slow", "u1")
        wait_for(lambda: Run.objects.filter(id=running.id, status=RunStatus.RUNNING, lease_token__gt=0).exists())
        services.run_cancel(principal=ALICE, agent_id=running.agent_id)
        wait_status(running.id, RunStatus.CANCELLED, timeout=10)
        wait_for(lambda: held("u1") == 0, timeout=3)


def test_reconciliation_frees_leaked_slots_and_keeps_live_ones(fair_stack: tuple[str, Any], cap: Any) -> None:
    cap(per_user=1)
    client = sync_client()
    with consumers_paused(fair_stack[1], "runs", "maintenance"):
        leaked, live = start("slow", "u1"), start("slow", "u2")
        # A process that committed a terminal state and died before releasing:
        Run.objects.filter(id=leaked.id).update(status=RunStatus.FAILED)
        fairness.run_slot_take(run_id="r_vanished", tenant_id="", user_id="u3")  # taken, row never written
        before = client.zscore(f"{PREFIX}u:/u2", live.id) or 0.0
        time.sleep(0.01)
        assert services.run_slots_reconcile() == 1
        assert (held("u1"), held("u2"), held("u3")) == (0, 1, 1)  # a young vanished slot is kept
        assert (client.zscore(f"{PREFIX}u:/u2", live.id) or 0.0) > before > 0  # a live run's slot is refreshed
        freed = fairness.run_slots_reconcile(liveness=lambda ids: {}, grace_ms=0)
        assert freed.freed == 2 and held("u3") == 0 and client.hlen(RUNS_KEY) == 0
        assert services.run_slots_reconcile() == 0  # idempotent
        Run.objects.filter(id=live.id).update(status=RunStatus.CANCELLED)


def test_the_beat_sweeper_reconciles_a_leaked_slot(fair_stack: tuple[str, Any], cap: Any) -> None:
    cap(per_user=1)
    with consumers_paused(fair_stack[1], "runs"):
        leaked = start("slow", "u1")
        Run.objects.filter(id=leaked.id).update(status=RunStatus.FAILED)
        wait_for(lambda: held("u1") == 0, timeout=10)  # the beat rings the sweeper every second in tests
        assert not sync_client().hexists(RUNS_KEY, leaked.id)
        assert start("echo", "u1").user_id == "u1"  # admitted again


def test_a_sub_agent_counts_against_its_roots_user_cap(fair_stack: tuple[str, Any], cap: Any) -> None:
    """Issue 33: a sub-agent no longer shares its parent's slot. With a per-user cap of 1
    the parent holds it, so its spawn is refused in its tool result and no child exists."""
    cap(per_user=1)
    parent = start("spawner", "u1")
    done = wait_status(parent.id, RunStatus.COMPLETED, timeout=30)
    assert done.user_id == "u1" and not Run.objects.filter(parent_id=parent.id).exists()
    [refusal] = [e.payload for e in RunEvent.objects.filter(run_id=parent.id, type="tool_result")]
    assert refusal["is_error"] is True and "per-user quota exhausted: user=u1 cap=1" in str(refusal["text"])
    wait_for(lambda: held("u1") == 0, timeout=3)


def test_end_to_end_a_per_user_cap_of_1_over_http(fair_stack: tuple[str, Any]) -> None:
    """Cap 1 in the environment of Daphne and the workers: a slow run for u1 is
    admitted, a second is refused, another user is admitted, and once the first
    finishes u1 is admitted again."""
    base, _ = fair_stack
    with httpx.Client(base_url=base, timeout=30) as http:

        def post(user: str, agent: str) -> httpx.Response:
            return http.post("/v1/runs", json={"agent": agent, "prompt": "hi", "background": True, "user_id": user})

        first = post("u1", "slow")
        assert first.status_code == 202, first.text
        refused = post("u1", "echo")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
        assert refused.json() == OVER_CAP_U1
        other = post("u2", "echo")
        assert other.status_code == 202, other.text
        stats = http.get("/v1/_concurrency/stats").json()
        assert stats["per_user"].get("u1") == 1 and stats["caps"] == {"per_user": 1, "per_tenant": 0}
        assert stats["active"] + stats["queued"] >= 1
        wait_status(other.json()["run_id"], RunStatus.COMPLETED)
        wait_status(first.json()["run_id"], RunStatus.COMPLETED, timeout=30)
        again = wait_for(lambda: (r := post("u1", "echo")).status_code == 202 and r, timeout=3)
        wait_status(again.json()["run_id"], RunStatus.COMPLETED)
