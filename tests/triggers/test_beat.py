"""Schedules across real processes: beat processes sending the tick, Celery
workers running it and the runs it creates, a web process for the admin
routes. The per-minute test runs the workers on a fast clock
(tests/triggers/fast_clock.py: one "minute" every 2 s); the code paths are
the production ones."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.channels.models import ChannelMessage
from apps.runs.dispatch import enqueue_iteration
from apps.runs.models import TERMINAL, Run, RunStatus
from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.triggers.models import ScheduleFire, ScheduleState
from tests import procs
from tests.conftest import wait_for
from tests.triggers.fast_clock import fast_now

KIND = get_kind("schedule")
ACME = substrate.Author(tenant_id="acme", subject="ops")
SCRIPT = 'Run it. MOCK_SCRIPT: [{"text": "done"}]'
FACTOR = 30.0  # one fast minute = 2 real seconds

pytestmark = pytest.mark.usefixtures("agents")


def schedule(name: str, **fields: Any) -> ScheduleDef:
    overlay = {"agent": "scripted", "schedule": "* * * * *", "prompt": SCRIPT, "user_id": name, **fields}
    out = substrate.def_create(KIND, ACME, {"name": name, "overlay": overlay})
    return ScheduleDef.objects.get(id=out["def_id"])


class Cluster:
    """Workers and beats of one test, with their own environment and clock."""

    def __init__(self, env: dict[str, str], logdir: Path, fast: bool) -> None:
        self.env, self.logdir, self.fast = env, logdir, fast
        self.workers: list[Any] = []
        self.beats: list[Any] = []
        self._n = 0

    def _celery(self) -> list[str]:
        return [sys.executable, "-m", "tests.triggers.fast_clock"] if self.fast else procs.CELERY

    def worker(self) -> None:
        self._n += 1
        argv = [*self._celery(), "worker", "--pool", "threads", "-c", "8", "-Q", "runs,maintenance"]
        argv += ["-n", f"sched{self._n}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"]
        self.workers.append(procs.spawn(argv, self.env, self.logdir / f"sched-worker{self._n}.log"))

    def beat(self) -> None:
        self._n += 1
        argv = [*procs.CELERY, "beat", "--loglevel", "INFO", "-s", str(self.logdir / f"sched-beat{self._n}")]
        self.beats.append(procs.spawn(argv, self.env, self.logdir / f"sched-beat{self._n}.log"))

    def kill9(self, proc: Any) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)

    def stop(self) -> None:
        for proc in self.beats + self.workers:
            procs.stop(proc)


@pytest.fixture
def cluster_env(stack_env: dict[str, str]) -> dict[str, str]:
    return {**stack_env, "LOOMCYCLE_SCHEDULER_ENABLED": "1", "LOOMCYCLE_SCHEDULER_TICK_SECONDS": "0.5"}


@pytest.fixture
def fast_cluster(cluster_env: dict[str, str], logdir: Path) -> Iterator[tuple[Cluster, float]]:
    t0 = time.time()
    env = {**cluster_env, "LOOMCYCLE_TEST_CLOCK_T0": str(t0), "LOOMCYCLE_TEST_CLOCK_FACTOR": str(FACTOR)}
    cluster = Cluster(env, logdir, fast=True)
    try:
        yield cluster, t0
    finally:
        cluster.stop()


def fire_times(row: ScheduleDef) -> list[datetime]:
    return list(ScheduleFire.objects.filter(schedule_def=row).order_by("fire_time").values_list("fire_time", flat=True))


def all_fired(rows: list[ScheduleDef], n: int) -> bool:
    return all(len(fire_times(r)) >= n for r in rows)


@pytest.mark.solo  # a fast clock (one minute = 2 s): run alone, not beside another module
def test_two_beats_fire_each_minute_once_through_kills_and_restarts(fast_cluster: tuple[Cluster, float]) -> None:
    cluster, t0 = fast_cluster
    rows = [schedule(f"minutely-{i}", catch_up_max=5) for i in range(4)]
    for _ in range(2):
        cluster.worker()
        cluster.beat()
    wait_for(lambda: all_fired(rows, 5), timeout=60)
    cluster.kill9(cluster.beats[0])  # a beat gone without a goodbye
    cluster.kill9(cluster.workers[0])  # and a worker, whose tick may be mid-transaction
    killed_at = fast_now(t0, FACTOR)
    wait_for(lambda: all_fired(rows, 9), timeout=60)  # the survivors carry on
    cluster.beat()
    cluster.worker()
    wait_for(lambda: all_fired(rows, 14), timeout=60)
    for beat in cluster.beats:
        procs.stop(beat)
    stopped_at = fast_now(t0, FACTOR)
    live = Run.objects.filter(user_id__startswith="minutely-").exclude(status__in=TERMINAL)
    _ring_what_the_killed_tick_left(live, killed_at)
    try:
        wait_for(lambda: not live.exists(), 60)
    except AssertionError:  # say which runs are stuck, and where
        cols = ("id", "user_id", "status", "step", "lease_owner", "attempts", "created_at", "updated_at")
        raise AssertionError(f"runs not finished 60 s after the beats stopped: {list(live.values(*cols))}") from None
    for row in rows:
        times = fire_times(row)
        gaps = {b - a for a, b in itertools.pairwise(times)}
        assert gaps == {timedelta(minutes=1)}, (row.name, times)  # no slot skipped, none twice
        assert times[-1] >= stopped_at.replace(second=0, microsecond=0) - timedelta(minutes=1)
        fires = ScheduleFire.objects.filter(schedule_def=row)
        runs = Run.objects.filter(user_id=row.name)
        assert runs.count() == fires.count() == len({f.run_id for f in fires})  # one run per fire, no duplicate
        assert set(runs.values_list("status", flat=True)) == {RunStatus.COMPLETED}


def _ring_what_the_killed_tick_left(live: Any, killed_at: datetime) -> None:
    """A tick killed between its commit and its on-commit doorbells leaves its runs queued,
    unleased and never attempted. The lease sweep rings them once they have sat
    `LOOMCYCLE_REQUEUE_GRACE_SECONDS` (120 s) by Postgres's clock, judged by `updated_at`; this
    fast clock writes timestamps ahead of Postgres's, so here the sweep never would. So: wait
    until every run still live was created in the fast minute before the kill (any other must
    finish by itself), and ring those never attempted as the sweep would."""
    window = (killed_at - timedelta(minutes=1), killed_at)
    with contextlib.suppress(AssertionError):  # a run outside the window that never finishes is named below
        wait_for(lambda: not live.exclude(created_at__range=window).exists(), 60)
    unrung = live.filter(created_at__range=window, status=RunStatus.QUEUED, attempts=0, lease_owner="")
    for run_id, step in unrung.values_list("id", "step"):
        enqueue_iteration(run_id, step)


@pytest.fixture
def real_cluster(cluster_env: dict[str, str], logdir: Path) -> Iterator[Cluster]:
    cluster = Cluster(cluster_env, logdir, fast=False)
    cluster.worker()
    cluster.beat()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_one_shot_fires_once_retires_and_posts_its_channel_message(
    real_cluster: Cluster, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    hooks = [{"kind": "channel.publish", "channel": "handoff", "payload": {"report": "ready"}}]
    row = schedule("one-shot", schedule="0 0 1 1 *", max_fires=1, on_complete=hooks)
    url = f"/v1/_schedules/{row.id}"
    assert http.post(url + "/run-now", headers=people["charlie"]).status_code == 404  # another tenant's
    done = http.post(url + "/run-now", headers=people["alice"])
    assert done.json() == {"def_id": row.id, "scheduled": "next-tick"}
    fire = wait_for(lambda: ScheduleFire.objects.filter(schedule_def=row, run_status="completed").first(), 60)
    message = wait_for(lambda: ChannelMessage.objects.filter(tenant_id="acme", channel="handoff").first(), 30)
    assert message.payload == {
        "schedule_name": "one-shot",
        "run_id": fire.run_id,
        "agent_id": Run.objects.get(id=fire.run_id).agent_id,
        "payload": {"report": "ready"},
    }
    row.refresh_from_db()
    assert row.retired and ScheduleFire.objects.filter(schedule_def=row).count() == 1
    fire.refresh_from_db()
    assert fire.hook_results == [{"kind": "channel.publish", "ok": True}]
    state = http.get(url + "/state", headers=people["alice"]).json()
    assert (state["last_run_id"], state["last_status"], state["next_run_at"], state["fire_count"]) == (
        fire.run_id,
        "completed",
        None,
        1,
    )


def test_admin_routes_pause_resume_list_and_refuse_bad_input(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    row = schedule("admin-routes", schedule="*/5 * * * *")
    alice, charlie, bob = people["alice"], people["charlie"], people["bob"]
    listed = http.get("/v1/_schedules/list-all", headers=alice).json()["entries"]
    assert [(e["def_id"], e["name"], e["schedule"]) for e in listed] == [(row.id, "admin-routes", "*/5 * * * *")]
    assert http.get("/v1/_schedules/list-all?tenant=acme", headers=charlie).json() == {"entries": []}
    assert http.post(f"/v1/_schedules/{row.id}/pause", headers=alice).json() == {"def_id": row.id, "paused": True}
    state = http.get(f"/v1/_schedules/{row.id}/state", headers=alice).json()
    assert state["paused_until"].startswith("9999-")
    assert http.post(f"/v1/_schedules/{row.id}/resume", headers=alice).json() == {"def_id": row.id, "paused": False}
    state = ScheduleState.objects.get(schedule_def=row)
    assert state.paused_until is None and state.next_run_at is not None
    assert state.next_run_at > datetime.now(UTC) and state.next_run_at.minute % 5 == 0
    missing = http.get("/v1/_schedules/def_0000000000000000/state", headers=alice)
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    bad = http.post("/v1/_schedules/not-a-def!/pause", headers=alice)
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_def_id")
    bad = http.get("/v1/_schedules/list-all?tenant=no/such", headers=alice)
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_tenant")
    assert http.post(f"/v1/_schedules/{row.id}/pause", headers=bob).status_code == 403  # members only read
    retired = substrate.def_retire(KIND, ACME, {"def_id": row.id, "retired": True})
    assert retired["retired"] is True
    gone = http.post(f"/v1/_schedules/{row.id}/run-now", headers=alice)
    assert (gone.status_code, gone.json()["code"]) == (409, "schedule_not_active")
