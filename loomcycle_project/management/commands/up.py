"""`manage.py up`: migrate, load loomcycle.yaml, then run and supervise the
web server (Daphne), Celery workers, Celery beat, Flower and, with LOOMCYCLE_GRPC_ADDR set,
the gRPC server (`manage.py grpc`) as children.

A child that dies is restarted (with a back-off); Ctrl-C / SIGTERM stops
every child (SIGTERM, then SIGKILL after a grace period) and then the
embedded Postgres/Redis this process started.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection

from apps.core.errors import ApplicationError
from apps.substrate.openmode import admin_credential_missing, credential_configured
from loomcycle_project import env as E
from loomcycle_project.bootstrap import boot
from loomcycle_project.hardening import not_dumpable
from loomcycle_project.logprefix import Prefixer

log = logging.getLogger("loomcycle.up")
GRACE_S = 20.0
LOOPBACK_ADDRS = frozenset({"127.0.0.1", "localhost", "::1"})
OPEN_MODE_WARNING = (
    "OPEN MODE: no LOOMCYCLE_AUTH_TOKEN, no operator token and no public LOOMCYCLE_ALLOWED_HOSTS name; "
    "the API accepts unauthenticated loopback clients."
)
NO_ADMIN_WARNING = (
    "open mode is over (an operator token or a public LOOMCYCLE_ALLOWED_HOSTS name exists) but no admin "
    "credential does (no LOOMCYCLE_AUTH_TOKEN, no substrate:admin token): nobody can administer this runtime "
    "over the API. "
    "Mint one: `manage.py token create --name admin --tenant ops`."
)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = field(default=0.0)
    pass_fds: tuple[int, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str], logs: Prefixer | None = None) -> None:
        """Start the child; with `logs`, its stdout and stderr reach `up`'s stdout prefixed with its name."""
        env = {**env, **self.extra_env}
        piped: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if logs else {}
        self.proc = subprocess.Popen(self.argv, env=env, start_new_session=True, pass_fds=self.pass_fds, **piped)
        if logs is not None and self.proc.stdout is not None:
            logs.attach(self.name, self.proc.stdout)
        self.started_at = time.monotonic()


def split_addr(addr: str, name: str = "LOOMCYCLE_LISTEN_ADDR") -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise CommandError(f"{name} must be host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def starts_in_open_mode(host: str) -> bool:
    """Whether the runtime starts in open mode (apps.substrate.openmode: no LOOMCYCLE_AUTH_TOKEN,
    no live OperatorTokenDef, no public LOOMCYCLE_ALLOWED_HOSTS name; so call it after
    migrating). Open mode on a non-loopback listen address is refused (CommandError)."""
    if credential_configured():
        return False
    if host not in LOOPBACK_ADDRS:
        raise CommandError(
            "refusing to listen on a non-loopback address in open mode: set LOOMCYCLE_AUTH_TOKEN or mint an "
            "admin token first (`manage.py token create --name admin --tenant ops`)"
        )
    return True


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Daphne binds: TIME_WAIT is not "in use"
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def listen_socket(host: str, port: int) -> socket.socket:
    """The web's listening socket, bound once here so that several Daphne
    processes accept on it (the kernel spreads connections among them)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def web_children(host: str, port: int, sock: socket.socket | None) -> list[Child]:
    py = sys.executable
    app = "loomcycle_project.asgi:application"
    if sock is None:
        return [Child("web", [py, "-m", "daphne", "-b", host, "-p", str(port), app])]
    fd = sock.fileno()
    return [
        Child(f"web{i}", [py, "-m", "daphne", "--fd", str(fd), app], pass_fds=(fd,)) for i in range(E.WEB_PROCESSES)
    ]


def celery_argv() -> list[str]:
    """The Celery command line every Celery child starts with. With JSON logs, `--quiet`:
    the start-up banners are printed, not logged, and would be the only non-JSON lines."""
    quiet = ["--quiet"] if E.LOG_FORMAT == "json" else []
    return [sys.executable, "-m", "celery", "-A", "workers.celery:app", *quiet]


def children(host: str, port: int, sock: socket.socket | None = None) -> list[Child]:
    celery = celery_argv()
    out = web_children(host, port, sock)
    for i in range(E.WORKER_PROCESSES):
        out.append(
            Child(
                f"worker{i}",
                [
                    *celery,
                    "worker",
                    "--pool",
                    "threads",
                    "-c",
                    str(E.WORKER_CONCURRENCY),
                    "-Q",
                    "runs,maintenance",
                    "-n",
                    f"w{i}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "--loglevel",
                    E.LOG_LEVEL,
                ],
            )
        )
    schedule = str(E.DATA_DIR / "celerybeat-schedule")
    out.append(Child("beat", [*celery, "beat", "--loglevel", E.LOG_LEVEL, "-s", schedule]))
    if E.FLOWER_ENABLED:
        out.append(flower_child(celery))
    if settings.LOOMCYCLE.grpc_addr:  # its own process beside the web tier (apps/grpcapi/server.py)
        out.append(Child("grpc", [sys.executable, "-m", "loomcycle_project", "grpc"]))
    return out


def flower_child(celery: list[str]) -> Child:
    """Flower on loopback, or beyond it only behind basic auth (passed in the
    child's environment as FLOWER_BASIC_AUTH, never on its command line)."""
    address = E.FLOWER_ADDRESS
    if address.strip("[]") not in LOOPBACK_ADDRS and not E.FLOWER_BASIC_AUTH:
        raise CommandError(
            f"refusing to start Flower on {address} without basic auth: set LOOMCYCLE_FLOWER_BASIC_AUTH=user:password "
            "(or LOOMCYCLE_FLOWER_ADDRESS=127.0.0.1, or LOOMCYCLE_FLOWER_ENABLED=0)"
        )
    env = {"FLOWER_BASIC_AUTH": E.FLOWER_BASIC_AUTH} if E.FLOWER_BASIC_AUTH else {}
    # Flower's broker view parses the URL itself and knows `redis+socket://`, not the
    # `socket://` form the fast transport is given (settings.celery_broker): it gets
    # the Redis URL and kombu's stock transport, which is all it needs to read queues.
    env["LOOMCYCLE_FAST_TRANSPORT"] = "0"
    return Child("flower", [*celery, "flower", f"--port={E.FLOWER_PORT}", f"--address={address}"], extra_env=env)


class Command(BaseCommand):
    help = "Run the whole runtime: web, workers, beat and Flower (embedded Postgres/Redis by default)."
    logs: Prefixer | None = None

    def handle(self, *args: Any, **options: Any) -> None:
        not_dumpable()  # the supervisor's environment holds every secret its children get
        host, port = split_addr(settings.LOOMCYCLE.listen_addr)
        if not port_free(host, port):
            raise CommandError(f"{host}:{port} is already in use (set LOOMCYCLE_LISTEN_ADDR)")
        grpc_host = self._grpc_host()
        self.stdout.write("migrating the database and loading the yaml configuration ...")
        try:
            agents = boot(migrate=True, verbosity=1)
        except ApplicationError as exc:  # a config error: its message, not a traceback
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        except DatabaseError as exc:
            raise CommandError(f"migrating the database failed: {exc}") from exc
        try:
            if grpc_host is not None:
                starts_in_open_mode(grpc_host)  # open mode beyond loopback is refused for gRPC too
            if starts_in_open_mode(host):  # after migrating: operator tokens live in the database
                self.stderr.write(self.style.WARNING(OPEN_MODE_WARNING))
            elif admin_credential_missing():
                self.stderr.write(self.style.WARNING(NO_ADMIN_WARNING))
        finally:
            connection.close()  # the supervisor holds no connection while its children run
        self._warn_bash()
        self.stdout.write(f"agents: {', '.join(sorted(a.name for a in agents)) or '(none)'}")
        env = {
            **os.environ,
            "DATABASE_URL": os.environ["DATABASE_URL"],
            "REDIS_URL": os.environ["REDIS_URL"],
            "PYTHONUNBUFFERED": "1",
        }
        sock = listen_socket(host, port) if E.WEB_PROCESSES > 1 else None
        kids = children(host, port, sock)
        self.logs = Prefixer(width=max(len(child.name) for child in kids))
        for child in kids:
            child.start(env, self.logs)
        base = f"http://{host}:{port}"
        flower = f"http://{E.FLOWER_ADDRESS}:{E.FLOWER_PORT}/" if E.FLOWER_ENABLED else "off (LOOMCYCLE_FLOWER_ENABLED)"
        self.stdout.write(
            self.style.SUCCESS(
                f"loomcycle is up\n  API      {base}/v1  (OpenAPI docs {base}/v1/docs)\n  health   {base}/healthz\n"
                f"  admin    {base}/admin/\n  flower   {flower}\n  grpc     {grpc_banner()}\n"
                f"  data     {E.DATA_DIR}\nCtrl-C stops everything."
            )
        )
        self._supervise(kids, env)

    def _grpc_host(self) -> str | None:
        """LOOMCYCLE_GRPC_ADDR's host once its port is checked free; None when gRPC is off."""
        addr = settings.LOOMCYCLE.grpc_addr
        if not addr:
            return None
        host, port = split_addr(addr, "LOOMCYCLE_GRPC_ADDR")
        if not port_free(host, port):
            raise CommandError(f"{host}:{port} is already in use (set LOOMCYCLE_GRPC_ADDR)")
        return host

    def _warn_bash(self) -> None:
        """Bash on: say it loudly when it runs unsandboxed, or how to install the sandbox it lacks."""
        from apps.tools import sandbox

        warning = sandbox.operator_warning()
        if warning:
            self.stderr.write(self.style.WARNING(f"BASH: {warning}"))

    def _supervise(self, kids: list[Child], env: dict[str, str]) -> None:
        stopping = {"flag": False}

        def _stop(signum: int, _frame: Any) -> None:
            stopping["flag"] = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        while not stopping["flag"]:
            for child in kids:
                self._restart_if_dead(child, env)
            time.sleep(0.5)
        self.stdout.write("stopping children ...")
        stop_children(kids)
        self.stdout.write("stopped.")

    def _restart_if_dead(self, child: Child, env: dict[str, str]) -> None:
        if child.proc is None or child.proc.poll() is None:
            return
        now = time.monotonic()
        if child.next_start == 0.0:
            delay = min(30.0, 2.0 ** min(child.restarts, 5)) if now - child.started_at < 60 else 1.0
            child.next_start = now + delay
            self.stderr.write(
                self.style.ERROR(f"{child.name} exited with {child.proc.returncode}; restarting in {delay:.0f} s")
            )
        elif now >= child.next_start:
            child.restarts += 1
            child.next_start = 0.0
            child.start(env, self.logs)


def grpc_banner() -> str:
    addr = settings.LOOMCYCLE.grpc_addr
    return f"{addr}  (loomcycle.v1.Loomcycle, grpc.health.v1, reflection)" if addr else "off (LOOMCYCLE_GRPC_ADDR)"


def stop_children(kids: list[Child]) -> None:
    live = [c.proc for c in kids if c.proc is not None and c.proc.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for proc in live:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session, started with start_new_session
            proc.wait(5)
