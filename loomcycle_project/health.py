"""GET /healthz: liveness plus the state of Postgres, Redis and workers, this
replica's id and the live processes of the cluster (`replicas[]`). Always 200."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from redis import RedisError

import loomcycle_project
from apps.core.redis import sync_client
from loomcycle_project.replicas import replicas, web_beat
from workers.held import replica_id

STARTED = time.time()


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
    from workers.held import PRESENCE_PREFIX

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


def healthz(request: HttpRequest) -> JsonResponse:
    pg = _postgres()
    redis, workers = _redis_and_workers()
    return JsonResponse(
        {
            "ok": bool(pg["ok"] and redis["ok"]),
            "version": loomcycle_project.__version__,
            "uptime_seconds": int(time.time() - STARTED),
            "postgres": pg,
            "redis": redis,
            "workers": workers,
            "metrics_enabled": settings.LOOMCYCLE.metrics_enabled,
            "replica_id": replica_id(),
            "replicas": _replicas() if redis["ok"] else [],
        }
    )
