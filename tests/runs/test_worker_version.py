"""`worker_version` (issue 25, rolling deploy): every event an iteration appends
records the code version of the worker that ran it (LOOMCYCLE_WORKER_VERSION),
the events API and the run console show it, and a rolling cut-over (a new
worker started beside the old one, then the old one warm-stopped with SIGTERM
while it holds a lease) completes every run with each step recording the
version that ran it. The large run with published figures is
`make rolling-deploy` (bench/rolling.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.urls import reverse

from apps.runs import services
from apps.runs.models import TERMINAL, Run, RunEvent, RunStatus, ToolCallRecord
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_for, wait_status
from tests.factories.runs import drive
from tests.procs import WorkerPool
from workers import held

pytestmark = pytest.mark.usefixtures("agents")

OLD, NEW = "v-old-rolling", "v-new-rolling"
TOOL_RUNS, STEPS = 10, 6


def start(script: list[dict[str, Any]], *, interactive: bool = False) -> Run:
    prompt = "MOCK_SCRIPT: " + json.dumps(script)
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)], interactive=interactive)
    return services.run_create(principal=ALICE, data=data)


def versions_by_step(run_id: str) -> dict[int, set[str]]:
    """The worker versions of the events each step's iteration appended (creation's events excluded)."""
    out: dict[int, set[str]] = {}
    for step, version in (
        RunEvent.objects.filter(run_id=run_id).exclude(worker_version="").values_list("step", "worker_version")
    ):
        out.setdefault(step, set()).add(version)
    return out


def test_each_iteration_records_its_worker_version_and_the_api_and_console_show_it(
    no_workers: None, settings: Any, client: Client, admin_client: Client
) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, worker_version="v-in-process")
    run = drive(start([{"tool": "Context", "input": {"op": "time"}}, {"text": "done"}]).id)
    assert run.status == RunStatus.COMPLETED
    rows = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("type", "step", "worker_version"))
    created = [r for r in rows if r[0] in ("user_input", "system_prompt")]
    assert created and {v for _t, _s, v in created} == {""}  # appended by run creation, not an iteration
    iterated = [r for r in rows if r[0] not in ("user_input", "system_prompt")]
    assert {v for _t, _s, v in iterated} == {"v-in-process"} and {s for _t, s, _v in iterated} == {0, 1}
    events = client.get(f"/v1/runs/{run.id}/events").json()["events"]
    assert [(e["type"], e["step"], e["worker_version"]) for e in events] == rows
    page = admin_client.get(reverse("admin:runs_run_change", args=[quote(run.id)]))
    assert page.status_code == 200
    assert page.content.decode().count('class="worker-version"') == len(iterated)


@pytest.fixture
def pools(no_workers: None, stack_env: dict[str, str], logdir: Path) -> Iterator[tuple[WorkerPool, WorkerPool]]:
    """One old and one new worker process (8 threads each, as two releases of the code would
    run them), told apart only by LOOMCYCLE_WORKER_VERSION; both stopped at the end."""
    old = WorkerPool({**stack_env, "LOOMCYCLE_WORKER_VERSION": OLD}, logdir, size=1, concurrency=8, tag="rollold")
    new = WorkerPool({**stack_env, "LOOMCYCLE_WORKER_VERSION": NEW}, logdir, size=1, concurrency=8, tag="rollnew")
    try:
        yield old, new
    finally:
        for run_id in Run.objects.exclude(status__in=TERMINAL).values_list("id", flat=True):
            services.run_cancel(principal=ALICE, run_id=run_id, reason="test over")
        old.stop()
        new.stop()


def _owner_prefix(pid: int) -> str:
    """The lease_owner prefix of a worker process (workers.held.WORKER_ID: host:pid:token)."""
    return f"{held.WORKER_ID.split(':', 1)[0]}:{pid}:"


def _up(pid: int) -> bool:
    """The worker process has registered its presence (it consumes doorbells from here on)."""
    pattern = f"{held.PRESENCE_PREFIX}{_owner_prefix(pid)}*"
    from apps.core.redis import sync_client

    return any(True for _ in sync_client().scan_iter(pattern))


def _db_now() -> Any:
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def test_a_rolling_cut_over_completes_every_run_and_each_step_records_the_version_that_ran_it(
    pools: tuple[WorkerPool, WorkerPool],
) -> None:
    old, new = pools
    old.ensure()
    (old_pid,) = old.pids()
    # An interactive run whose first turn the old worker runs; it parks between the workers.
    chat = start(
        [{"tool": "Context", "input": {"op": "time"}}, {"text": "turn one"}, {"text": "turn two"}], interactive=True
    )
    wait_status(chat.id, RunStatus.AWAITING_INPUT, timeout=120)  # bounds include a worker's start on a busy host
    new.ensure()
    (new_pid,) = new.pids()
    wait_for(lambda: _up(new_pid), timeout=120)
    step = {"tool": "Context", "input": {"op": "tools"}, "sleep_ms": 400}
    runs = [start([step] * STEPS + [{"text": "done"}]) for _ in range(TOOL_RUNS)]
    # Mid-flight: the old worker holds a lease (an iteration it must be allowed to commit).
    wait_for(lambda: Run.objects.filter(lease_owner__startswith=_owner_prefix(old_pid)).exists(), timeout=60)
    os.kill(old_pid, signal.SIGTERM)  # Celery's warm shutdown: finish what runs, take nothing new
    old.procs[0].wait(60)
    cut = _db_now()
    services.run_input(principal=ALICE, run_id=chat.id, text="go on")
    for run in runs:
        wait_status(run.id, RunStatus.COMPLETED, timeout=90)
    wait_for(lambda: RunEvent.objects.filter(run_id=chat.id, type="awaiting_input").count() >= 2, timeout=60)

    assert old.procs[0].returncode == 0  # a warm shutdown, not a crash
    chat_versions = versions_by_step(chat.id)
    assert chat_versions[0] == {OLD} and chat_versions[max(chat_versions)] == {NEW}, chat_versions
    every = [chat.id, *(r.id for r in runs)]
    iterated = RunEvent.objects.filter(run_id__in=every).exclude(worker_version="")
    assert set(iterated.values_list("worker_version", flat=True)) == {OLD, NEW}
    assert not iterated.filter(created_at__gt=cut).exclude(worker_version=NEW).exists()  # after the cut: new only
    assert all(len(v) == 1 for r in every for v in versions_by_step(r).values())  # one worker per iteration
    assert {r.status for r in Run.objects.filter(id__in=[r.id for r in runs])} == {RunStatus.COMPLETED}
    for run_id in every:
        seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), run_id
    records = ToolCallRecord.objects.filter(run_id__in=[r.id for r in runs])
    assert records.count() == TOOL_RUNS * STEPS and not records.exclude(status="finished").exists()
    assert not records.values("run_id", "call_id").annotate(n=Count("id")).filter(n__gt=1).exists()
