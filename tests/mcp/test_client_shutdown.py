"""A worker stops its stdio MCP servers when it shuts down (apps.mcp.client.calls
`_on_worker_shutdown`, connected at McpConfig.ready() -> `shutdown`), rather than leaving them behind.

The server is the reference time server under `sh -c '...; sleep 60'`: on its own, the shell
outlives the worker by a minute (the time server ends at its stdin's EOF, the shell does not),
so only the worker's shutdown, which stops the server's whole process group, ends it at once.
The test's own worker (the session's are stopped, `no_workers`) gets a warm shutdown (SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from apps.core.types import Principal
from apps.mcp import services
from apps.runs import services as run_services
from apps.runs.models import RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.substrate.kinds import get_kind
from apps.substrate.services import def_sync_static
from tests.conftest import wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
SHELL = f"{sys.executable} -m mcp_server_time --local-timezone UTC; sleep 60"


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_worker_stops_its_stdio_servers_when_it_shuts_down(stack_env: dict[str, str], logdir: Path) -> None:
    raw = {"transport": "stdio", "command": "/bin/sh", "args": ["-c", SHELL]}
    row = def_sync_static(get_kind("mcpserver"), name="sticky", raw=raw)  # as a yaml `mcp_servers:` entry
    discovered = services.mcp_server_discover(row=row)
    assert discovered["ok"] and "get_current_time" in discovered["tools"], discovered

    pool = WorkerPool(stack_env, logdir, size=1, tag="mcpstop")
    pool.ensure()
    server: psutil.Process | None = None
    try:
        [worker] = pool.procs
        steps = [{"tool": "mcp__sticky__get_current_time", "input": {"timezone": "UTC"}}, {"text": "done"}]
        prompt = f"Use the tools. MOCK_SCRIPT: {json.dumps(steps)}"
        data = run_services.RunCreate(agent="mcp-user", segments=[Segment(text=prompt)])
        done = run_services.run_create(principal=ACME, data=data)
        wait_status(done.id, RunStatus.COMPLETED, timeout=90)
        [result] = RunEvent.objects.filter(run_id=done.id, type="tool_result")
        assert not result.payload["is_error"] and '"timezone": "UTC"' in result.payload["text"]

        [server] = [p for p in psutil.Process(worker.pid).children() if "mcp_server_time" in " ".join(p.cmdline())]
        worker.send_signal(signal.SIGTERM)  # warm shutdown
        assert worker.wait(30) is not None  # it ended on its own (no SIGKILL of its group)
        assert wait_for(lambda: _gone(server), timeout=10)
    finally:
        if server is not None and not _gone(server):
            os.killpg(server.pid, signal.SIGKILL)  # its own session (the SDK starts it so): the shell and its sleep
        pool.stop()
