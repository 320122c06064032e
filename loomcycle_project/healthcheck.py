"""`python -m loomcycle_project.healthcheck {web,worker,beat,flower,grpc} [--url URL]`: the health
of the process of that kind in this container (compose/docker-compose.yml runs it as each
service's healthcheck). Exit status 0 when healthy; otherwise 1, with one line on stderr
saying why. It loads Django settings (for REDIS_URL and the knobs) but never sets Django up,
so a check costs about half a second of one core.

- web: `GET /healthz` of this container answers 200 with `ok: true` (this replica reaches
  Postgres and Redis; it asks anonymously, so the body is `{"ok": ...}` alone). The URL
  defaults to LOOMCYCLE_LISTEN_ADDR's port on loopback; the request names the first of
  LOOMCYCLE_ALLOWED_HOSTS as its host, which /healthz checks.
- worker: a worker presence key of this host (`lc:worker:<host>:<pid>:…`, workers/held.py)
  names a process that is alive here. It is the key the lease sweeper reads: a worker whose
  key expired (one lease without a refresh) is dead to the cluster, and its doorbells are rung
  again elsewhere. Cheaper than `celery inspect ping` (no broadcast, no Celery app).
- beat: the file beat's scheduler keeps fresh (workers/heartbeat.py) is younger than three
  heartbeat periods (LOOMCYCLE_HEARTBEAT_SECONDS).
- flower: Flower's own `GET /healthcheck` (unauthenticated) answers `OK`.
- grpc: the standard `grpc.health.v1` Check of `loomcycle.v1.Loomcycle` answers SERVING, on
  loopback at LOOMCYCLE_GRPC_ADDR's port (or --url host:port).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMEOUT_S = 5.0
STALE_PERIODS = 3  # beat: heartbeat periods a file may age before beat counts as stuck


class Unhealthy(Exception):
    """Why the process is not healthy (the message is the line printed)."""


def _settings() -> Any:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings")
    from django.conf import settings

    return settings


def _get(url: str, host: str | None = None) -> tuple[int, bytes]:
    """Status and body of a GET (any status; a refused connection is Unhealthy)."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})  # noqa: S310 (http on loopback)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise Unhealthy(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def web_url() -> str:
    """/healthz on loopback at LOOMCYCLE_LISTEN_ADDR's port (its host when it is a specific one)."""
    host, _, port = _settings().LOOMCYCLE.listen_addr.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # a wildcard bind answers on loopback
        host = "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/healthz"


def web_host() -> str | None:
    """The Host header to send: the first name /healthz answers to (ALLOWED_HOSTS), or none
    (the URL's own host) when any name is allowed."""
    first = _settings().ALLOWED_HOSTS[0]
    return None if first == "*" else first.lstrip(".")


def check_web(url: str | None) -> str:
    """The check sends no bearer, so /healthz answers it `{"ok": ...}` only (200, or 503
    when Postgres or Redis is out of reach); an admin's details name which one."""
    target = url or web_url()
    status, body = _get(target, web_host())
    if status not in (200, 503):
        raise Unhealthy(f"{target} answered {status}")
    try:
        state = json.loads(body)
    except ValueError as exc:
        raise Unhealthy(f"{target} answered {status} without JSON") from exc
    if status != 200 or state.get("ok") is not True:
        down = [part for part in ("postgres", "redis") if not (state.get(part) or {}).get("ok", True)]
        raise Unhealthy(f"{target}: ok is false ({', '.join(down) or 'Postgres or Redis'} not reachable)")
    return f"{target}: ok"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _pid(key: str, raw: bytes | str | None) -> int | None:
    """The process a presence key names: its value's `pid`, else the key's `<host>:<pid>:` part."""
    try:
        return int(json.loads(raw or b"{}")["pid"])
    except (ValueError, KeyError, TypeError):
        parts = key.rsplit(":", 2)
        return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def host_name() -> str:
    """This container's host name, as a worker names itself in its presence key (workers.held.WORKER_ID)."""
    return socket.gethostname()


def check_worker(url: str | None) -> str:
    from redis import RedisError

    from apps.core.redis import sync_client
    from workers.held import PRESENCE_PREFIX

    prefix = f"{PRESENCE_PREFIX}{host_name()}:"
    try:
        client = sync_client()
        keys = [k.decode() for k in client.scan_iter(prefix + "*", count=500)]
        values = client.mget(keys) if keys else []
    except (RedisError, OSError) as exc:
        raise Unhealthy(f"Redis: {exc}") from exc
    live = [k for k, v in zip(keys, values, strict=True) if (pid := _pid(k, v)) is not None and _alive(pid)]
    if not live:
        raise Unhealthy(f"no live worker process of this host has a presence key ({prefix}*)")
    return f"worker presence: {', '.join(k.removeprefix(PRESENCE_PREFIX) for k in live)}"


def check_beat(url: str | None) -> str:
    cfg = _settings().LOOMCYCLE
    path = Path(cfg.beat_heartbeat_file)
    try:
        age = time.time() - path.stat().st_mtime
    except OSError as exc:
        raise Unhealthy(f"beat heartbeat file {path}: {exc.strerror}") from exc
    limit = STALE_PERIODS * cfg.heartbeat_seconds
    if age > limit:
        raise Unhealthy(f"beat heartbeat file {path} is {age:.0f} s old (more than {limit:g} s)")
    return f"beat heartbeat {age:.1f} s ago"


def check_flower(url: str | None) -> str:
    from loomcycle_project import env as E

    target = url or f"http://127.0.0.1:{E.FLOWER_PORT}/healthcheck"
    status, body = _get(target)
    if status != 200 or body.strip() != b"OK":
        raise Unhealthy(f"{target} answered {status}")
    return f"{target}: OK"


def grpc_target() -> str:
    """LOOMCYCLE_GRPC_ADDR on loopback (its host when it is a specific one)."""
    addr = _settings().LOOMCYCLE.grpc_addr
    if not addr:
        raise Unhealthy("LOOMCYCLE_GRPC_ADDR is unset: this container serves no gRPC")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # a wildcard bind answers on loopback
        host = "127.0.0.1"
    return f"{'[' + host + ']' if ':' in host else host}:{port}"


def check_grpc(url: str | None) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = url or grpc_target()
    request = health_pb2.HealthCheckRequest(service="loomcycle.v1.Loomcycle")
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        raise Unhealthy(f"{target}: {exc.code().name} {exc.details()}") from exc
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise Unhealthy(f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return f"{target}: SERVING"


CHECKS: dict[str, Callable[[str | None], str]] = {
    "web": check_web,
    "worker": check_worker,
    "beat": check_beat,
    "flower": check_flower,
    "grpc": check_grpc,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loomcycle_project.healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=sorted(CHECKS))
    parser.add_argument("--url", help="web: the /healthz URL; flower: the /healthcheck URL; grpc: host:port")
    args = parser.parse_args(argv)
    try:
        print(CHECKS[args.kind](args.url))
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
