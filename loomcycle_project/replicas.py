"""The live processes of the cluster, for /healthz's `replicas[]`.

Each process keeps a Redis key whose value is its entry (workers.held.presence_value):
- a worker: `lc:worker:<worker id>`, refreshed by its presence thread every
  LOOMCYCLE_HEARTBEAT_SECONDS, TTL one lease (workers/signals.py, which the
  lease sweeper already relied on);
- a web process: `lc:web:<process id>`, refreshed by `WebPresenceMiddleware`
  on a request when the last refresh is a heartbeat period old, TTL three
  periods. No thread: a web process that serves no request for three periods
  drops out of the list; the one answering /healthz always beats first, so it
  is always listed (a load balancer's health probe keeps every replica listed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
import threading
import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from redis import RedisError

from apps.core.middleware import HybridMiddleware
from apps.core.redis import sync_client
from apps.core.timefmt import iso_z
from workers.held import PRESENCE_PREFIX, WEB_PRESENCE_PREFIX, presence_value, replica_id

log = logging.getLogger("loomcycle.replicas")

# One id per web process, as a worker's (workers.held.WORKER_ID): a restarted process is another entry.
WEB_ID = f"{replica_id()}:{os.getpid()}:{secrets.token_hex(4)}"
LIST_CAP = 256  # entries /healthz lists at most


class _Beat:
    """When this web process last wrote its key (monotonic), behind a lock so
    concurrent requests write it once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = -math.inf

    def due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < settings.LOOMCYCLE.heartbeat_seconds:
                return False
            self._last = now
            return True


BEAT = _Beat()


def web_beat() -> None:
    """Write this web process's key (TTL three heartbeat periods). A Redis error
    is logged; the next due request retries."""
    ttl = max(1, math.ceil(3 * settings.LOOMCYCLE.heartbeat_seconds))
    try:
        sync_client().set(
            WEB_PRESENCE_PREFIX + WEB_ID,
            presence_value(kind="web", process_id=WEB_ID, version=settings.LOOMCYCLE.worker_version),
            ex=ttl,
        )
    except (RedisError, OSError) as exc:
        log.warning("web presence update failed: %s", exc)


class WebPresenceMiddleware(HybridMiddleware):
    """Refreshes the web presence key at most once per heartbeat period, off the
    event loop (a thread of the default executor), never delaying the request."""

    def sync_call(self, request: HttpRequest) -> Any:
        if BEAT.due():
            web_beat()
        return self.get_response(request)

    async def async_call(self, request: HttpRequest) -> Any:
        if BEAT.due():
            asyncio.get_running_loop().run_in_executor(None, web_beat)
        return await self.get_response(request)


def _entry(key: str, raw: bytes | str | None) -> dict[str, Any] | None:
    if raw is None:  # expired between SCAN and MGET
        return None
    try:
        value = json.loads(raw)
    except ValueError:  # a worker of an older release: its key holds a timestamp only
        value = {}
    if not isinstance(value, dict):
        value = {"last_heartbeat_at": value}
    kind = "web" if key.startswith(WEB_PRESENCE_PREFIX) else "worker"
    process_id = key.removeprefix(WEB_PRESENCE_PREFIX).removeprefix(PRESENCE_PREFIX)
    fields = ("replica_id", "hostname", "pid", "version")
    times = {f: _rfc3339(value.get(f)) for f in ("started_at", "last_heartbeat_at")}
    return {"id": process_id, "kind": kind, **{f: value.get(f) for f in fields}, **times}


def _rfc3339(epoch: Any) -> str | None:
    """Unix seconds (as the keys hold them) on the wire as RFC 3339 UTC, None when absent."""
    try:
        return iso_z(datetime.fromtimestamp(float(epoch), tz=UTC))
    except (TypeError, ValueError, OverflowError):
        return None


def replicas() -> list[dict[str, Any]]:
    """Every live web and worker process (at most LIST_CAP), web first, by id.
    Raises RedisError/OSError when Redis cannot be read."""
    client = sync_client()
    keys = [
        k.decode()
        for prefix in (WEB_PRESENCE_PREFIX, PRESENCE_PREFIX)
        for k in client.scan_iter(prefix + "*", count=500)
    ][:LIST_CAP]
    values = client.mget(keys) if keys else []
    entries = [e for k, v in zip(keys, values, strict=True) if (e := _entry(k, v)) is not None]
    return sorted(entries, key=lambda e: (e["kind"] != "web", e["id"]))
