"""The example app (examples/hostapp) loaded by LOOMCYCLE_EXTRA_APPS into a real web process
and real workers: `migrate` creates its tables, its host tool answers each run with the notes of
that run's user only, and its `run_finished` receiver leaves a durable row from the worker.

The test process itself does not load the app (the suite's other tests must not see its tool or
its receiver), so it reads and seeds the app's tables with SQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import current_app
from django.db import connection

from apps.runs.models import RunEvent, RunStatus
from tests import procs
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

EXTRA = {"LOOMCYCLE_EXTRA_APPS": "examples.hostapp"}
SCRIPT = [{"tool": "my_notes", "input": {}}, {"text": "listed"}]


@pytest.fixture(scope="module")
def hostapp_web(workers: procs.WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """migrate (which applies the example app's migration), then Daphne and two workers with the
    app loaded; the session's workers are stopped meanwhile. Yields the web URL."""
    env = {**stack_env, **EXTRA}
    migrate = [sys.executable, "manage.py", "migrate", "hostapp", "--noinput"]
    done = subprocess.run(migrate, env=env, cwd=procs.ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers.stop()
    pool = procs.WorkerPool(env, logdir / "hostapp")
    pool.ensure()
    port = procs.free_port()
    daphne = procs.web_argv(port)
    web = procs.spawn(daphne, env, logdir / "hostapp" / "daphne.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthz")
        wait_for(lambda: len(current_app.control.ping(timeout=1) or []) >= len(pool.pids()), timeout=60)
        yield base
    finally:
        procs.stop(web)
        pool.stop()
        workers.ensure()


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def start(base: str, user_id: str) -> str:
    body = {"agent": "notes-reader", "prompt": f"MOCK_SCRIPT: {json.dumps(SCRIPT)}", "user_id": user_id}
    resp = httpx.post(f"{base}/v1/runs", json={**body, "background": True}, timeout=30)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["run_id"])


def tool_result(run_id: str) -> dict[str, Any]:
    (row,) = RunEvent.objects.filter(run_id=run_id, type="tool_result")
    return dict(row.payload)


def test_the_host_tool_answers_each_run_with_its_users_notes_and_the_receiver_records_the_end(
    hostapp_web: str,
) -> None:
    sql("DELETE FROM hostapp_note")
    sql("DELETE FROM hostapp_finishedrun")
    for owner, text in (("u-ann", "ann: buy milk"), ("u-ann", "ann: call bob"), ("u-ben", "ben: fix bike")):
        sql("INSERT INTO hostapp_note (tenant_id, owner, text) VALUES ('', %s, %s)", owner, text)
    sql("INSERT INTO hostapp_note (tenant_id, owner, text) VALUES ('other', 'u-ann', 'another tenant''s ann')")
    ann, ben = start(hostapp_web, "u-ann"), start(hostapp_web, "u-ben")
    for run_id in (ann, ben):
        wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    assert json.loads(tool_result(ann)["text"]) == ["ann: call bob", "ann: buy milk"]
    assert json.loads(tool_result(ben)["text"]) == ["ben: fix bike"]
    assert not tool_result(ann)["is_error"]
    finished = wait_for(lambda: len(rows := sql("SELECT run_id, status FROM hostapp_finishedrun")) >= 2 and rows)
    assert sorted(finished) == sorted([(ann, "completed"), (ben, "completed")])


def test_a_run_finished_sent_again_by_the_sweep_is_recorded_once_by_the_example_receiver(hostapp_web: str) -> None:
    """A worker that died after its commit: its outbox row (same id, past the grace) is re-sent by the
    lease sweep on a real worker. Lost before the send, the receiver records it; lost after the send
    (the receiver ran, the delete did not), the receiver's get_or_create on delivery_id adds nothing."""
    sql("DELETE FROM hostapp_finishedrun")
    run_id = start(hostapp_web, "u-again")
    wait_status(run_id, RunStatus.COMPLETED, timeout=60)
    recorded = wait_for(lambda: sql("SELECT delivery_id, status FROM hostapp_finishedrun WHERE run_id = %s", run_id))
    assert wait_for(lambda: not sql("SELECT 1 FROM runs_signaloutbox WHERE run_id = %s", run_id))
    ((delivery_id, status),) = recorded
    assert status == "completed"
    sql("DELETE FROM hostapp_finishedrun")  # died before the send: the receiver never saw it
    for _crash in ("before the send", "after the send"):
        sql(
            "INSERT INTO runs_signaloutbox (id, signal, run_id, kwargs, created_at) "
            "VALUES (%s, 'run_finished', %s, %s::jsonb, now() - interval '1 hour')",
            delivery_id,
            run_id,
            json.dumps({"run_id": run_id, "status": status}),
        )
        current_app.send_task("maintenance.run_leases_sweep")  # what beat sends every LOOMCYCLE_SWEEP_SECONDS
        assert wait_for(lambda: not sql("SELECT 1 FROM runs_signaloutbox WHERE id = %s", delivery_id))
        assert sql("SELECT delivery_id, run_id, status FROM hostapp_finishedrun") == [(delivery_id, run_id, status)]


def test_a_bad_extra_app_path_fails_at_start_naming_it() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "loomcycle_project.settings", "LOOMCYCLE_EXTRA_APPS": "nope.app"}
    probe = [sys.executable, "-c", "import django; django.setup()"]
    done = subprocess.run(probe, env=env, cwd=procs.ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "LOOMCYCLE_EXTRA_APPS: no module 'nope.app'" in done.stderr
