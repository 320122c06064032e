"""The user-facing pytest plugin (loomcycle_http.testing), run as a user runs it:
a separate pytest process with `-p loomcycle_http.testing`, its own ini (our
addopts do not apply), and a Django project of its own in the environment.
The documented example runs verbatim; the runtime it starts leaves nothing
behind, whether the session ends or its pytest is killed; the user's Celery,
Django and provider settings never reach it; and `loomcycle_python` runs it
from another environment."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest

from tests.procs import ROOT

EXAMPLE = ROOT / "examples" / "test_my_agent.py"
USER_SUITE = Path(__file__).resolve().parent / "user_suite"
USER_YAML = """\
agents:
  greeter:
    provider: mock
    model: mock-tool-loop?tool=Context&calls=1
    system_prompt: Say hello.
    tools: [Context]
"""
THEIR_SETTINGS = 'SECRET_KEY = "the-users-own-project"\nINSTALLED_APPS = []\nDATABASES = {}\nUSE_TZ = True\n'


GRACE_S = 30.0  # for processes a stopped runtime is still ending


def _runtime_venv(tmp: Path) -> Path:
    """A separate environment for the runtime, as `loomcycle_python` is meant
    for: a venv of its own (no pip) whose .pth puts this checkout and the
    dependencies of the project's .venv on its path. Returns its interpreter."""
    venv = tmp / "runtime-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], str(ROOT)])
    (site / "loomcycle.pth").write_text("\n".join(deps) + "\n")
    return venv / "bin" / "python"


def _user_project(tmp: Path, runtime_python: Path | None = None) -> dict[str, str]:
    """A user's repository in `tmp` (ini, yaml, their own Django settings) and
    their environment: none of this project's test settings, and a
    DATABASE_URL, DJANGO_SETTINGS_MODULE, DJANGO_SECRET_KEY, Celery broker and
    provider key and URL of their own that the runtime must never see (and a
    VOYAGE_BASE_URL their ini passes on)."""
    ini = "[pytest]\nloomcycle_config_files = user.yaml\nloomcycle_pass_env = VOYAGE_BASE_URL\n"
    if runtime_python is not None:
        ini += f"loomcycle_python = {runtime_python}\n"
    (tmp / "pytest.ini").write_text(ini)
    (tmp / "user.yaml").write_text(USER_YAML)
    (tmp / "users_own_project").mkdir()
    (tmp / "users_own_project" / "__init__.py").write_text("")
    (tmp / "users_own_project" / "settings.py").write_text(THEIR_SETTINGS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOMCYCLE_", "PYTEST_"))}
    env.update(
        PYTHONPATH=f"{tmp}{os.pathsep}{ROOT}",  # the checkout, as a user's path to an uninstalled runtime
        DJANGO_SETTINGS_MODULE="users_own_project.settings",
        DATABASE_URL="postgresql://nobody@127.0.0.1:1/their_own_db",
        REDIS_URL="redis://127.0.0.1:1/0",
        CELERY_BROKER_URL="redis://127.0.0.1:1/must-not-leak",
        DJANGO_SECRET_KEY="must-not-leak-secret",
        ANTHROPIC_API_KEY="sk-test-must-not-leak",
        OPENAI_BASE_URL="http://127.0.0.1:1/must-not-leak",
        VOYAGE_BASE_URL="http://127.0.0.1:1/passed-on",
        KIT_RECORD=str(tmp / "record.json"),
        KIT_RUNTIME_PYTHON=str(runtime_python or ""),
    )
    return env


def _pytest(tmp: Path, *files: Path) -> list[str]:
    """The command line in the user's repository, with `files` copied into it
    (byte for byte: under this checkout, pytest would load our own conftest.py)."""
    (tmp / "kit_record.py").write_bytes((USER_SUITE / "kit_record.py").read_bytes())
    for file in files:
        (tmp / file.name).write_bytes(file.read_bytes())
    ini = str(tmp / "pytest.ini")
    return [sys.executable, "-m", "pytest", "-p", "loomcycle_http.testing", "-c", ini, "-v", *(f.name for f in files)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _port_open(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        return sock.connect_ex((parts.hostname or "", parts.port or 0)) == 0


def test_docs_show_the_example_file_verbatim() -> None:
    docs = (ROOT / "docs" / "testing.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```" in docs


@pytest.mark.timeout(780)  # the session starts three runtimes (one fails at once) on a possibly loaded host
def test_the_example_and_the_plugin_checks_pass_and_leave_nothing_running(tmp_path: Path) -> None:
    """The session's runtime runs under `loomcycle_python` (a venv of its own)."""
    env = _user_project(tmp_path, runtime_python=_runtime_venv(tmp_path))
    argv = _pytest(tmp_path, EXAMPLE, USER_SUITE / "plugin_checks.py")
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=720)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert re.search(r"test_my_agent\.py::test_the_agent_remembers_the_colour PASSED", out), out[-6000:]
    assert re.search(r"^=+ 17 passed", out, re.MULTILINE), out[-3000:]
    _assert_gone(json.loads((tmp_path / "record.json").read_text()), deadline=time.monotonic() + GRACE_S)


def _assert_gone(record: dict[str, Any], deadline: float) -> None:
    """Every recorded process of the runtime (up, web, worker, beat, Postgres,
    Redis) is gone by `deadline`, and its port is closed."""
    processes = {int(pid): cmdline for pid, cmdline in record["processes"].items()}
    for part in ("daphne", "celery -A workers.celery:app worker", "celery -A workers.celery:app beat", "valkey-server"):
        assert any(part in cmdline for cmdline in processes.values()), (part, processes)
    assert any(cmdline.split(" ")[0].endswith("postgres") for cmdline in processes.values()), processes
    while [pid for pid in processes if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {pid: processes[pid] for pid in processes if _alive(pid)} == {}
    assert not _port_open(record["url"])


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.2)
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.mark.timeout(540)  # start (300) + the killed pytest's exit (120) + what `up` then stops (60)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_an_interrupted_or_killed_pytest_takes_the_runtime_down(tmp_path: Path, signum: signal.Signals) -> None:
    """Ctrl-C: pytest tears the session fixture down. SIGKILL: no teardown and
    no atexit run, and only PR_SET_PDEATHSIG is left to stop `up`."""
    env = _user_project(tmp_path)
    argv = _pytest(tmp_path, USER_SUITE / "plugin_killed.py")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        record = _wait_for(tmp_path / "record.json", proc, timeout=300)
    finally:
        proc.send_signal(signum)
        out = proc.communicate(timeout=120)[0]
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in out and proc.returncode == 2, out[-3000:]
    _assert_gone(record, deadline=time.monotonic() + 60)  # `up` stops its children (20 s grace), then Postgres


def test_importing_the_plugin_touches_nothing_of_the_runtime() -> None:
    """What a user's pytest process gets from loading the plugin: no Django
    settings module, none of the runtime's packages, no Celery, no Django."""
    probe = (
        "import os, sys, loomcycle_http.testing; "
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'apps', 'workers', 'loomcycle_project', 'django', "
        "'celery', 'kombu'}); print(os.environ.get('DJANGO_SETTINGS_MODULE'), loaded)"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None []", done.stdout + done.stderr
