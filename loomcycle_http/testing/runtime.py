"""A loomcycle runtime for a test session: `python -m loomcycle_project up` as
one child process, or an already-running runtime named by its URL.

Invariants:
- Nothing of the runtime is imported here: importing `loomcycle_project`
  runs its Celery setup (it sets DJANGO_SETTINGS_MODULE and connects Celery
  signal handlers), which must never happen in a user's
  pytest process. The package is only located (`importlib.util.find_spec`).
- The child gets an environment of its own (`runtime_env`): what belongs to
  the user's own process (DATABASE_URL, REDIS_URL, PYTHONPATH,
  LOOMCYCLE_AUTH_TOKEN, every DJANGO_* and CELERY_* variable) and every
  provider key and base URL never reach it unless the user names them in
  `loomcycle_pass_env`, so `up` starts its embedded Postgres and Redis under
  the session's data dir, with a legacy LOOMCYCLE_AUTH_TOKEN of the session's
  own (the client sends it) on a free loopback port, and offers
  no paid provider. Every process below `up` inherits a marker variable
  naming the session, by which (with the processes remembered at start) `stop()`
  finds what a dead `up` left behind.
- Linux only (PR_SET_PDEATHSIG, /proc): elsewhere `start_runtime` refuses
  with a RuntimeStartError before spawning anything.
- The child dies with the test process: PR_SET_PDEATHSIG sends `up` SIGTERM
  when pytest dies (even by SIGKILL), and `up` then stops its own children
  and the embedded Postgres/Redis as on Ctrl-C. `stop()` does the same
  explicitly, escalates to SIGKILL of every process it found under `up`, and
  ends whatever still carries the session's marker once `up` is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loomcycle_http.testing.processes import (
    SESSION_MARKER,
    command_line,
    descendants,
    end_processes,
    family,
    remember,
)

STOP_GRACE_S = 60.0  # `up` gives its children 20 s, then stops Postgres and Redis
LEFTOVER_GRACE_S = 10.0  # SIGTERM to SIGKILL, for processes a dead `up` left running
LEFTOVER_ROUNDS = 3
_PR_SET_PDEATHSIG = 1
# As loomcycle_project.env reads them (apps.core.secrets.PROVIDER_KEY_NAMES and the
# *_BASE_URL settings; tests/testing_kit/test_runtime.py keeps the lists in step).
PROVIDER_ENV = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "DEEPSEEK_API_KEY",
        "GEMINI_API_KEY",
        "OLLAMA_API_KEY",
        "VOYAGE_API_KEY",
        "BRAVE_API_KEY",  # WebSearch's hosted backend (apps.tools.search_backends)
        "ANTHROPIC_BASE_URL",
        "OPENAI_BASE_URL",
        "DEEPSEEK_BASE_URL",
        "GEMINI_BASE_URL",
        "OLLAMA_BASE_URL",
        "OLLAMA_CLOUD_BASE_URL",
        "VOYAGE_BASE_URL",
    }
)
# Never passed to the runtime unless named in `loomcycle_pass_env`: they belong to the
# user's own process, or would turn on a real (paid) provider.
_DROPPED_ENV = frozenset(
    {
        "DATABASE_URL",
        "REDIS_URL",
        "PYTHONPATH",
        "LOOMCYCLE_AUTH_TOKEN",
        "LOOMCYCLE_CONFIG_DIR",  # the runtime's configuration is the session's files, nothing else
        "LOOMCYCLE_EMBEDDED_POSTGRES",
        *PROVIDER_ENV,
    }
)
# Celery reads CELERY_BROKER_URL, CELERY_RESULT_BACKEND, CELERY_CONFIG_MODULE, ... before
# Django settings; the runtime sets DJANGO_SETTINGS_MODULE itself and generates its SECRET_KEY.
_DROPPED_PREFIXES = ("CELERY_", "DJANGO_")
# The plugin's defaults; the user's environment may override them (e.g. LOOMCYCLE_MOCK_LATENCY_MS).
_DEFAULT_ENV = {
    "LOOMCYCLE_MOCK_LATENCY_MS": "0",
    "LOOMCYCLE_MOCK_LATENCY_JITTER_MS": "0",
    "LOOMCYCLE_WORKER_CONCURRENCY": "8",
}
_IMPORT_PROBE = "import importlib.util, sys; sys.exit(importlib.util.find_spec('loomcycle_project') is None)"


class RuntimeStartError(RuntimeError):
    """The runtime did not come up; the message carries the tail of its log."""


def _libc() -> ctypes.CDLL:
    """libc, loaded in the parent before any fork: the child only calls into it."""
    return ctypes.CDLL(None, use_errno=True)


def _refuse_non_linux() -> None:
    if not sys.platform.startswith("linux"):
        raise RuntimeStartError(
            f"loomcycle_http.testing starts a runtime on Linux only (it uses prctl and /proc), not on {sys.platform}: "
            "start one yourself and point the tests at it with --loomcycle-url"
        )


def free_port() -> int:
    """A loopback port free right now (`up` refuses clearly if it is taken before it binds)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def project_root() -> Path:
    """The directory that holds the `loomcycle_project` package (a checkout or site-packages)."""
    spec = importlib.util.find_spec("loomcycle_project")
    if spec is None or spec.origin is None:
        raise RuntimeStartError(
            "loomcycle_project is not importable by this interpreter: install loomcycle here, put its checkout on "
            "sys.path, or name the interpreter of an environment that has it in the ini option loomcycle_python"
        )
    return Path(spec.origin).resolve().parent.parent


def _dropped(name: str, passed: Collection[str]) -> bool:
    return name not in passed and (name in _DROPPED_ENV or name.startswith(_DROPPED_PREFIXES))


def runtime_env(
    data_dir: Path,
    port: int,
    config_files: list[Path],
    *,
    pythonpath: str | None,
    marker: str,
    pass_env: Collection[str] = (),
) -> dict[str, str]:
    """The child's environment: the user's, minus what belongs to their own
    process and every provider variable (unless named in `pass_env`), plus
    the plugin's fixed settings (these always win). `pythonpath` None: no
    PYTHONPATH is set (the interpreter finds the runtime installed)."""
    env = {k: v for k, v in os.environ.items() if not _dropped(k, pass_env)}
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    if not config_files:  # no files: an empty config, never the bundled loomcycle.yaml
        empty = data_dir / "empty.yaml"
        empty.write_text("{}\n")
        config_files = [empty]
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.update(
        {SESSION_MARKER: marker},
        PYTHONUNBUFFERED="1",
        LOOMCYCLE_DATA_DIR=str(data_dir),
        LOOMCYCLE_LISTEN_ADDR=f"127.0.0.1:{port}",
        LOOMCYCLE_CONFIG_FILES=",".join(str(p) for p in config_files),
        LOOMCYCLE_WORKER_PROCESSES="1",
        LOOMCYCLE_WEB_PROCESSES="1",
        LOOMCYCLE_FLOWER_ENABLED="0",
        LOOMCYCLE_MOCK_ENABLED="1",
    )
    # A credential of the session's own unless the user passed one on: open mode ends with the
    # first token a test mints (a tenant's too), and the session's client must not be locked out.
    env.setdefault("LOOMCYCLE_AUTH_TOKEN", f"lcs_{secrets.token_urlsafe(24)}")
    return env


@dataclass
class Runtime:
    """A runtime the session talks to over HTTP. `proc` is None for an
    external one (`--loomcycle-url`), which the plugin never stops."""

    url: str
    token: str | None = None
    data_dir: Path | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    startup_seconds: float = 0.0
    python: str | None = None  # the interpreter `up` runs under
    marker: str = field(default="", repr=False)  # SESSION_MARKER's value in its processes' environment
    known: dict[int, str] = field(default_factory=dict, repr=False)  # its processes when it was ready

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(no log)"
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def processes(self) -> list[int]:
        """Pids of `up` and every process below it (web, worker, beat), now."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *descendants(self.proc.pid)]

    def stop(self) -> None:
        """Stop `up` (SIGTERM: it stops its children, then Postgres and Redis);
        past STOP_GRACE_S, SIGKILL it and every process found below it. Then end
        whatever is left of the runtime (`processes.family`: what an `up` that
        died left orphaned), in up to LEFTOVER_ROUNDS rounds, and if anything
        was, raise saying so. Idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.known.update(remember(self.processes()))
            self._stop_up(proc)
        ended: dict[int, str] = {}
        for _ in range(LEFTOVER_ROUNDS):  # a dying Postgres may start a process while it is being ended
            left = [pid for pid in family(self.marker, self.known) if pid != proc.pid] if self.marker else []
            if not left:
                break
            ended.update({pid: command_line(pid) for pid in left})
            end_processes(left, LEFTOVER_GRACE_S)
        if ended:
            names = ", ".join(f"{pid} {line}" for pid, line in ended.items())
            raise RuntimeError(
                f"loomcycle `up` (exit status {proc.returncode}) left processes running; ended them: {names}\n"
                f"{self.log_tail()}"
            )

    def _stop_up(self, proc: subprocess.Popen[bytes]) -> None:
        below = descendants(proc.pid)  # found now: once `up` is killed, its children are orphans
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *below]:
                with contextlib.suppress(ProcessLookupError):  # already gone
                    os.kill(pid, signal.SIGKILL)
            proc.wait(5)
            if self.marker:
                end_processes(family(self.marker, self.known), LEFTOVER_GRACE_S)
            raise RuntimeError(f"loomcycle did not stop within {STOP_GRACE_S} s; killed.\n{self.log_tail()}") from None


def _check_paths(data_dir: Path, config_files: list[Path]) -> None:
    """Refuse what `up` could not use, before anything is spawned."""
    missing = [str(p) for p in config_files if not p.is_file()]
    if missing:
        raise RuntimeStartError(f"loomcycle config file(s) not found: {', '.join(missing)}")
    # LOOMCYCLE_CONFIG_FILES separates its items with both ',' and ':'.
    unlisted = [str(p) for p in config_files if "," in str(p) or ":" in str(p)]
    if unlisted:
        raise RuntimeStartError(f"a loomcycle config path cannot contain ',' or ':': {', '.join(unlisted)}")
    if not config_files and ("," in str(data_dir) or ":" in str(data_dir)):
        raise RuntimeStartError(
            f"the loomcycle data dir cannot contain ',' or ':' when no config file is given (its empty.yaml "
            f"goes into LOOMCYCLE_CONFIG_FILES, which separates items with both): {data_dir}"
        )


def _interpreter(python: str | None) -> tuple[str, str | None]:
    """(interpreter, PYTHONPATH for the child). Default: this interpreter, with
    the runtime found here on the child's path; `python` (loomcycle_python) must
    find the runtime installed in its own environment."""
    if python is None:
        return sys.executable, str(project_root())
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise RuntimeStartError(f"loomcycle_python {python} is not an executable file")
    return python, None


def _check_importable(python: str, env: dict[str, str], data_dir: Path) -> None:
    try:
        probe = subprocess.run(  # the runtime's own environment and working directory, as `up` gets them
            [python, "-c", _IMPORT_PROBE], env=env, cwd=data_dir, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        raise RuntimeStartError(f"loomcycle_python {python} did not answer within 120 s") from None
    if probe.returncode != 0:
        raise RuntimeStartError(
            f"loomcycle_python {python} cannot import loomcycle_project: install loomcycle in that environment "
            f"(exit status {probe.returncode}) {probe.stderr[-1000:]}"
        )


def _stop_after(runtime: Runtime, exc: BaseException) -> None:
    """Stop a runtime that failed to start; a failure to stop is added to `exc`, which stays the error."""
    try:
        runtime.stop()
    except RuntimeError as stop_error:
        exc.add_note(f"and stopping it: {stop_error}")


def start_runtime(
    data_dir: Path,
    config_files: list[Path],
    timeout: float,
    *,
    python: str | None = None,
    pass_env: Collection[str] = (),
) -> Runtime:
    """Spawn `<python> -m loomcycle_project up` (python: loomcycle_python, else
    this interpreter) and wait until it is ready (see wait_ready)."""
    _refuse_non_linux()
    _check_paths(data_dir, config_files)
    data_dir.mkdir(parents=True, exist_ok=True)
    interpreter, pythonpath = _interpreter(python)
    port, marker = free_port(), secrets.token_hex(8)
    env = runtime_env(data_dir, port, config_files, pythonpath=pythonpath, marker=marker, pass_env=pass_env)
    if pythonpath is None:
        _check_importable(interpreter, env, data_dir)
    log_path = data_dir / "runtime.log"
    began = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [interpreter, "-m", "loomcycle_project", "up"],
            cwd=data_dir,  # not the user's directory: their own `apps` or `workers` package must not shadow ours
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches pytest, which then stops `up` in order
            preexec_fn=functools.partial(_libc().prctl, _PR_SET_PDEATHSIG, signal.SIGTERM),  # only a C call
        )
    runtime = Runtime(
        url=f"http://127.0.0.1:{port}",
        token=env["LOOMCYCLE_AUTH_TOKEN"],  # the session's own, or the one passed on by pass_env
        data_dir=data_dir,
        log_path=log_path,
        proc=proc,
        python=interpreter,
        marker=marker,
    )
    try:
        wait_ready(runtime, timeout)
    except BaseException as exc:
        _stop_after(runtime, exc)
        raise
    runtime.startup_seconds = time.monotonic() - began
    runtime.known = remember(runtime.processes())  # Redis among them: its environment hides the marker
    return runtime


def _ready(health: dict[str, object]) -> bool:
    """Postgres and Redis answer and at least one worker is present (a run can start at once)."""
    workers = health.get("workers")
    return bool(health.get("ok")) and isinstance(workers, dict) and int(workers.get("count", 0)) >= 1


def wait_ready(runtime: Runtime, timeout: float) -> None:
    """Poll /healthz until ready; a child that exits, or the deadline, is a
    RuntimeStartError carrying the log tail."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if runtime.proc is not None and runtime.proc.poll() is not None:
            raise RuntimeStartError(
                f"loomcycle exited with {runtime.proc.returncode} while starting; log {runtime.log_path}:\n"
                f"{runtime.log_tail()}"
            )
        try:
            # The worker count is an admin's detail: open mode on loopback, else the runtime's token.
            headers = {"Authorization": f"Bearer {runtime.token}"} if runtime.token else {}
            answer = httpx.get(runtime.url + "/healthz", headers=headers, timeout=2)
            if answer.status_code == 200 and _ready(answer.json()):
                return
            last = f"{answer.status_code} {answer.text[:300]}"
        except httpx.HTTPError as exc:  # not listening yet: retried until the deadline, then reported
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeStartError(
        f"loomcycle was not ready within {timeout:g} s (last /healthz: {last}); log {runtime.log_path}:\n"
        f"{runtime.log_tail()}"
    )
