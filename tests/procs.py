"""Real processes for integration tests: Celery workers, beat and Daphne.
Every process binds to loopback and is stopped by the fixture that started it."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CELERY = [sys.executable, "-m", "celery", "-A", "workers.celery:app"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the test process dies, so a
    killed pytest leaves no web or worker process consuming the test Redis."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("ab")
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # only a C call into libc, loaded before any fork
    )


class WorkerPool:
    """N Celery worker processes (threads pool); can kill one and top up."""

    def __init__(
        self,
        env: dict[str, str],
        logdir: Path,
        size: int = 2,
        concurrency: int = 16,
        tag: str = "test",
        queues: str = "runs,maintenance",
    ) -> None:
        self.env, self.logdir, self.size, self.concurrency, self.tag = env, logdir, size, concurrency, tag
        self.queues = queues
        self.procs: list[subprocess.Popen[bytes]] = []
        self.beat: subprocess.Popen[bytes] | None = None
        self._n = 0

    def _start_one(self) -> subprocess.Popen[bytes]:
        self._n += 1
        argv = [
            *CELERY,
            "worker",
            "--pool",
            "threads",
            "-c",
            str(self.concurrency),
            "-Q",
            self.queues,
            "-n",
            f"{self.tag}{self._n}@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
        ]
        proc = spawn(argv, self.env, self.logdir / f"{'worker' if self.tag == 'test' else self.tag}{self._n}.log")
        self.procs.append(proc)
        return proc

    def ensure(self) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) < self.size:
            self._start_one()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def kill(self, pid: int) -> None:
        os.killpg(pid, signal.SIGKILL)
        for p in self.procs:
            if p.pid == pid:
                p.wait(5)

    def stop(self) -> None:
        for p in self.procs:
            stop(p)
        self.procs = []

    def start_beat(self) -> None:
        """Celery beat with this pool's environment (one beat per cluster at a time)."""
        argv = [*CELERY, "beat", "--loglevel", "INFO", "-s", str(self.logdir / "beat-schedule")]
        self.beat = spawn(argv, self.env, self.logdir / "beat.log")

    def stop_beat(self) -> None:
        if self.beat is not None:
            stop(self.beat)
            self.beat = None


def web_argv(port: int) -> list[str]:
    """A Daphne web process of the runtime on a loopback port."""
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "loomcycle_project.asgi:application"]


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError as exc:  # not listening yet: retried until the deadline, then reported
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s (last error: {last})")
