"""GET /healthz: whether this replica reaches Postgres and Redis.

Anonymous callers (and any principal without `substrate:admin`) get only
`{"ok": true|false}`: host names, pids, versions and the services' error
text are for admins (an admin bearer, or the open-mode principal on
loopback). 200 when ok, 503 when not, for everyone.

The view is async and never touches Django's one sync thread (shared with
every sync API view): the checks run on threads of the default executor
(`sync_to_async(thread_sensitive=False)`), concurrently, each bounded by
CHECK_TIMEOUT_S so a hung service makes the answer `ok: false`, not a
hung probe. A thread whose check ran out is left to finish on its own (a
thread cannot be cancelled); the answer does not wait for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from redis import RedisError

import loomcycle_project
from apps.core.errors import ApplicationError
from apps.core.redis import sync_client
from apps.substrate.auth import ADMIN, aauthenticate_for, bearer_from_headers, has_scope, lower_headers
from loomcycle_project.replicas import replicas, web_beat
from workers.held import PRESENCE_PREFIX, replica_id

STARTED = time.time()
CHECK_TIMEOUT_S = 3.0
_NO_REPLICAS: list[dict[str, Any]] = []  # what a replica listing that ran out of time shows
T = TypeVar("T")


def _postgres() -> dict[str, Any]:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cur.fetchone()
        return {"ok": True, "pgvector": row[0] if row else None}
    except DatabaseError as exc:  # reported in the body; healthz itself must answer
        return {"ok": False, "error": str(exc)}
    finally:
        connection.close()


def _redis_and_workers() -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        client = sync_client()
        client.ping()
        names = sorted(k.decode().removeprefix(PRESENCE_PREFIX) for k in client.scan_iter(PRESENCE_PREFIX + "*"))
        return {"ok": True}, {"ok": bool(names), "count": len(names), "names": names}
    except (RedisError, OSError) as exc:  # reported in the body; healthz itself must answer
        return {"ok": False, "error": str(exc)}, {"ok": False, "count": 0, "names": []}


def _replicas() -> list[dict[str, Any]]:
    """This process beats first, so the list always holds the replica answering."""
    web_beat()
    try:
        return replicas()
    except (RedisError, OSError):  # Redis is down: `redis.ok` is false in the same body
        return []


async def _off_thread(check: Callable[[], T], timed_out: T) -> T:
    """`check()` on an executor thread (never the shared sync thread), or `timed_out`."""
    try:
        return await asyncio.wait_for(sync_to_async(check, thread_sensitive=False)(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return timed_out


def _late(service: str) -> dict[str, Any]:
    return {"ok": False, "error": f"{service} did not answer within {CHECK_TIMEOUT_S:g} s"}


async def _is_admin(request: HttpRequest) -> bool:
    """Whether the caller may see the details; any failure to authenticate is anonymous."""
    token = bearer_from_headers(lower_headers(request.headers.items()))
    try:
        principal = await aauthenticate_for(token, request.META.get("REMOTE_ADDR"), "GET", "/healthz")
    except ApplicationError:
        return False
    return has_scope(principal.scopes, ADMIN)


async def healthz(request: HttpRequest) -> JsonResponse:
    admin, pg, (redis, workers) = await asyncio.gather(
        _is_admin(request),
        _off_thread(_postgres, _late("postgres")),
        _off_thread(_redis_and_workers, (_late("redis"), {"ok": False, "count": 0, "names": []})),
    )
    ok = bool(pg["ok"] and redis["ok"])
    status = 200 if ok else 503
    if not admin:
        return JsonResponse({"ok": ok}, status=status)
    body = {
        "ok": ok,
        "version": loomcycle_project.__version__,
        "uptime_seconds": int(time.time() - STARTED),
        "postgres": pg,
        "redis": redis,
        "workers": workers,
        "metrics_enabled": settings.LOOMCYCLE.metrics_enabled,
        "replica_id": replica_id(),
        "grpc": {"addr": settings.LOOMCYCLE.grpc_addr},  # None: no gRPC served (apps/grpcapi)
        "replicas": await _off_thread(_replicas, _NO_REPLICAS) if redis["ok"] else [],
    }
    return JsonResponse(body, status=status)
