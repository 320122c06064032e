"""The README quick start for real: `manage.py up` on the embedded default."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest
from django.core.management import call_command

from tests.procs import ROOT, free_port, wait_http


def _up(data: Path, port: int, log: Path, web_processes: int = 1, grpc_addr: str = "") -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "LOOMCYCLE_GRPC_ADDR")}
    if grpc_addr:
        env["LOOMCYCLE_GRPC_ADDR"] = grpc_addr
    env.update(
        LOOMCYCLE_DATA_DIR=str(data),
        LOOMCYCLE_LISTEN_ADDR=f"127.0.0.1:{port}",
        LOOMCYCLE_WORKER_PROCESSES="1",
        LOOMCYCLE_WORKER_CONCURRENCY="4",
        LOOMCYCLE_FLOWER_PORT=str(free_port()),
        LOOMCYCLE_FLOWER_ENABLED="1",
        LOOMCYCLE_CONFIG_FILES=str(ROOT / "loomcycle.yaml"),
        LOOMCYCLE_WEB_PROCESSES=str(web_processes),
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", "up"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> list[int]:
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    return [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def _grpc_serves_a_run(target: str, log: Path) -> None:
    """`up` with LOOMCYCLE_GRPC_ADDR: its banner names the address and loomcycle.v1 serves a run there."""
    from tests.factories.grpc import wait_serving

    wait_serving(target, timeout=60)
    from apps.grpcapi.proto import loomcycle_pb2 as pb
    from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc

    block = pb.PromptContentBlock(type="trusted-text", text="hi")
    with grpc.insecure_channel(target) as channel:
        events = list(
            pb_grpc.LoomcycleStub(channel).Run(
                pb.RunRequest(agent="echo", segments=[pb.PromptSegment(role="user", content=[block])]), timeout=60
            )
        )
    assert [e.type for e in events] == ["session", "agent", "started", "text", "usage", "done"]
    assert f"grpc     {target}  (loomcycle.v1.Loomcycle" in log.read_text()


def test_up_serves_runs_on_the_embedded_default_and_stops_cleanly(server_tmp: Path) -> None:
    tmp_path = server_tmp  # its Postgres data dir must stay reachable by the postgres user (tests/conftest.py)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    grpc_addr = f"127.0.0.1:{free_port()}"
    proc = _up(tmp_path / "data", port, log, grpc_addr=grpc_addr)
    try:
        wait_http(base + "/healthz", timeout=90)
        _grpc_serves_a_run(grpc_addr, log)
        with httpx.stream("POST", base + "/v1/runs", content='{"agent":"echo","prompt":"hi"}', timeout=30) as resp:
            lines = list(resp.iter_lines())
        frames = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
        assert frames == ["session", "agent", "started", "text", "usage", "done"]
        run_id = json.loads(next(ln for ln in lines if '"run_id"' in ln).removeprefix("data: "))["run_id"]
        health = httpx.get(base + "/healthz").json()
        assert health["postgres"]["ok"] and health["redis"]["ok"] and health["workers"]["count"] == 1
        assert health["grpc"] == {"addr": grpc_addr}  # where gRPC is served (an admin's detail)
        runs = httpx.get(base + "/v1/users/_/agents", params={"status": "all"}).json()["agents"]
        assert runs == []
        mint = {"op": "create", "name": "ops", "tenant_id": "ops"}
        token = httpx.post(base + "/v1/_operatortokendef", json=mint).json()["token"]
    finally:
        leftovers = _stop(proc)
    assert leftovers == [], log.read_text()[-3000:]
    # The children's lines reach up's output prefixed with their name; plain, as the log is no terminal.
    prefixes = {line.split("|")[0].strip() for line in log.read_text().splitlines() if " | " in line}
    assert {"web", "worker0", "beat", "flower"} <= prefixes and "\033[" not in log.read_text()
    # `up` generated the instance's secrets once (0600); every process hashed with its pepper.
    secrets_file = tmp_path / "data" / "secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    generated = json.loads(secrets_file.read_text())
    assert generated["secret_key"] and generated["operator_token_pepper"] and generated["postgres_password"]
    # A second `up` reuses the data: the run from the first session is still there.
    # This time two Daphne processes share the one listening socket `up` bound.
    proc = _up(tmp_path / "data", port, log, web_processes=2)
    try:
        wait_http(base + "/healthz", timeout=90)
        kids = psutil.Process(proc.pid).children(recursive=True)
        assert sum(1 for k in kids if "daphne" in k.cmdline() and "--fd" in k.cmdline()) == 2
        assert not any("grpc" in k.cmdline() for k in kids)  # LOOMCYCLE_GRPC_ADDR unset: no gRPC
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(base + "/healthz", headers=bearer).json()["grpc"] == {"addr": None}
        for _ in range(6):  # connections spread over both; every one is answered, the token still valid
            again = httpx.get(f"{base}/v1/runs/{run_id}", headers=bearer).json()
            assert again["status"] == "completed" and again["run_id"] == run_id
        assert json.loads(secrets_file.read_text()) == generated  # the second `up` reused them
    finally:
        assert _stop(proc) == []


def test_doctor_passes_on_the_test_stack(capsys: pytest.CaptureFixture[str], db: None) -> None:
    call_command("doctor")
    out = capsys.readouterr().out
    assert "PASS postgres" in out and "PASS pgvector" in out and "PASS redis" in out and "FAIL" not in out


def test_doctor_fails_with_exit_1_on_a_broken_config(
    capsys: pytest.CaptureFixture[str], db: None, settings: object, tmp_path: Path
) -> None:
    import dataclasses

    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: [oops\n")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(bad),))  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as exc:
        call_command("doctor")
    assert exc.value.code == 1
    assert "FAIL config" in capsys.readouterr().out


def test_doctor_fails_naming_bubblewrap_when_bash_is_on_without_it(
    capsys: pytest.CaptureFixture[str], db: None, settings: Any
) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_enabled=True, bash_bwrap="/nonexistent/bwrap")
    with pytest.raises(SystemExit) as exc:
        call_command("doctor")
    out = capsys.readouterr().out
    assert exc.value.code == 1 and "FAIL bash sandbox:" in out and "apt-get install bubblewrap" in out


def test_doctor_warns_loudly_when_bash_runs_unsandboxed(
    capsys: pytest.CaptureFixture[str], db: None, settings: Any
) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_enabled=True, bash_unsandboxed=True)
    call_command("doctor")
    assert "WARN bash sandbox: Bash runs UNSANDBOXED" in capsys.readouterr().out


def test_at_its_defaults_up_starts_threads_for_5000_model_calls() -> None:
    """`make run`'s worker processes x threads (env.py's defaults, no variable set) hold >= 5,000
    runs in their provider calls at once: a run holds its thread through the call."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMCYCLE_WORKER_")}
    code = "from loomcycle_project import env as E; print(E.WORKER_PROCESSES, E.WORKER_CONCURRENCY)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    processes, threads = (int(v) for v in out.stdout.split())
    assert processes == 2
    assert processes * threads >= 5000
