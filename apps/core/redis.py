"""Redis connections for signals and wake-ups (the broker has its own)."""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio as aioredis
from django.conf import settings


def client_url() -> str:
    """REDIS_URL as redis-py understands it (kombu's redis+socket:// -> unix://)."""
    url: str = settings.REDIS_URL
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    return url


@cache
def sync_client() -> redis.Redis:
    return redis.Redis.from_url(client_url(), health_check_interval=30)


def async_client() -> aioredis.Redis:
    """A new asyncio client; each event loop must own its own."""
    return aioredis.Redis.from_url(client_url(), health_check_interval=30)
