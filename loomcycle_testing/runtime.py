"""A loomcycle runtime for a test session: `python -m loomcycle_project up` as
one child process, or an already-running runtime named by its URL.

Invariants:
- Nothing of the runtime is imported here: importing `loomcycle_project`
  runs its Celery setup (it sets DJANGO_SETTINGS_MODULE and connects Celery
  signal handlers), which must never happen in a user's
  pytest process. The package is only located (`importlib.util.find_spec`).
- The child gets an environment of its own: the user's DATABASE_URL,
  REDIS_URL, DJANGO_SETTINGS_MODULE, PYTHONPATH and LOOMCYCLE_AUTH_TOKEN never
  reach it (their process may be a different Django project), so `up` starts
  its embedded Postgres and Redis under the session's data dir, in open mode
  on a free loopback port.
- The child dies with the test process: PR_SET_PDEATHSIG sends `up` SIGTERM
  when pytest dies (even by SIGKILL), and `up` then stops its own children
  and the embedded Postgres/Redis as on Ctrl-C. `stop()` does the same
  explicitly and escalates to SIGKILL of every process it found under `up`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

STOP_GRACE_S = 60.0  # `up` gives its children 20 s, then stops Postgres and Redis
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it
_PR_SET_PDEATHSIG = 1
# Never passed to the runtime: they belong to the user's own process.
_DROPPED_ENV = frozenset(
    {
        "DATABASE_URL",
        "REDIS_URL",
        "DJANGO_SETTINGS_MODULE",
        "PYTHONPATH",
        "LOOMCYCLE_AUTH_TOKEN",
        "LOOMCYCLE_CONFIG_DIR",  # the runtime's configuration is the session's files, nothing else
        "LOOMCYCLE_EMBEDDED_POSTGRES",
    }
)
# The plugin's defaults; the user's environment may override them (e.g. LOOMCYCLE_MOCK_LATENCY_MS).
_DEFAULT_ENV = {
    "LOOMCYCLE_MOCK_LATENCY_MS": "0",
    "LOOMCYCLE_MOCK_LATENCY_JITTER_MS": "0",
    "LOOMCYCLE_WORKER_CONCURRENCY": "8",
}


class RuntimeStartError(RuntimeError):
    """The runtime did not come up; the message carries the tail of its log."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies, so
    `up` stops everything it started even if pytest is killed."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now (Linux /proc, as PR_SET_PDEATHSIG is)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # the command name may hold spaces and ")"
        except OSError:  # the process exited while we looked: it has no descendants to find
            continue
        out[int(stat.parent.name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now (children, their children, ...)."""
    parents = _parents()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        kids = [child for child, parent in parents.items() if parent in frontier]
        found.extend(kids)
        frontier = kids
    return found


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
            "loomcycle_project is not importable: install loomcycle or put its checkout on sys.path"
        )
    return Path(spec.origin).resolve().parent.parent


def runtime_env(data_dir: Path, port: int, config_files: list[Path]) -> dict[str, str]:
    """The child's environment: the user's, minus what belongs to their own
    process, plus the plugin's fixed settings (these always win)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    if not config_files:  # no files: an empty config, never the bundled loomcycle.yaml
        empty = data_dir / "empty.yaml"
        empty.write_text("{}\n")
        config_files = [empty]
    env.update(
        PYTHONPATH=str(project_root()),
        PYTHONUNBUFFERED="1",
        LOOMCYCLE_DATA_DIR=str(data_dir),
        LOOMCYCLE_LISTEN_ADDR=f"127.0.0.1:{port}",
        LOOMCYCLE_CONFIG_FILES=",".join(str(p) for p in config_files),
        LOOMCYCLE_WORKER_PROCESSES="1",
        LOOMCYCLE_WEB_PROCESSES="1",
        LOOMCYCLE_FLOWER_ENABLED="0",
        LOOMCYCLE_MOCK_ENABLED="1",
    )
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
        past STOP_GRACE_S, SIGKILL it and every process found below it. Idempotent."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        below = descendants(proc.pid)  # found now: once `up` is killed, its children are orphans
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *below]:
                with contextlib.suppress(ProcessLookupError):  # already gone
                    os.kill(pid, signal.SIGKILL)
            proc.wait(5)
            raise RuntimeError(f"loomcycle did not stop within {STOP_GRACE_S} s; killed.\n{self.log_tail()}") from None


def start_runtime(data_dir: Path, config_files: list[Path], timeout: float) -> Runtime:
    """Spawn `python -m loomcycle_project up` and wait until it is ready (see wait_ready)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    missing = [str(p) for p in config_files if not p.is_file()]
    if missing:
        raise RuntimeStartError(f"loomcycle config file(s) not found: {', '.join(missing)}")
    unlisted = [str(p) for p in config_files if "," in str(p) or ":" in str(p)]
    if unlisted:  # LOOMCYCLE_CONFIG_FILES separates its items with both
        raise RuntimeStartError(f"a loomcycle config path cannot contain ',' or ':': {', '.join(unlisted)}")
    port = free_port()
    log_path = data_dir / "runtime.log"
    began = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loomcycle_project", "up"],
            cwd=data_dir,  # not the user's directory: their own `apps` or `workers` package must not shadow ours
            env=runtime_env(data_dir, port, config_files),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches pytest, which then stops `up` in order
            preexec_fn=_die_with_parent,  # only a C call into libc, loaded before any fork
        )
    runtime = Runtime(url=f"http://127.0.0.1:{port}", data_dir=data_dir, log_path=log_path, proc=proc)
    try:
        wait_ready(runtime, timeout)
    except BaseException:
        runtime.stop()
        raise
    runtime.startup_seconds = time.monotonic() - began
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
            answer = httpx.get(runtime.url + "/healthz", timeout=2)
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
