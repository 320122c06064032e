"""Redis connections for signals and wake-ups (the broker has its own).

Both clients ride out a Redis restart: a command whose connection broke, or that
cannot connect, is tried again on a fresh connection with exponential backoff
and full jitter (redis-py's own `Retry`): RETRIES tries, waits capped at
RETRY_CAP_S, at most ~8.5 s in all and about half that on average; then it
raises. A restart of the server takes well under that. What it gives up: a
command whose reply was lost with its connection may run twice (a duplicate
doorbell or wake-up, which the claim and the readers' re-read make harmless;
an INCR of an epoch counted twice, which only invalidates a cache once more).
"""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

# Waits of up to 0.05 s doubling to 1 s: 0.05 + 0.1 + ... + 0.8 + 8 x 1 = ~8.5 s at most.
RETRY_BASE_S, RETRY_CAP_S, RETRIES = 0.05, 1.0, 12
_RETRY_ON = (RedisConnectionError, RedisTimeoutError)  # a refused connect is a ConnectionError too


def client_url() -> str:
    """REDIS_URL as redis-py understands it (kombu's redis+socket:// -> unix://)."""
    url: str = settings.REDIS_URL
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    return url


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=RETRY_BASE_S, cap=RETRY_CAP_S)


@cache
def sync_client() -> redis.Redis:
    retry = Retry(_backoff(), RETRIES, supported_errors=_RETRY_ON)
    return redis.Redis.from_url(client_url(), health_check_interval=30, retry=retry)


def async_client() -> aioredis.Redis:
    """A new asyncio client; each event loop must own its own."""
    retry = AsyncRetry(_backoff(), RETRIES, supported_errors=_RETRY_ON)
    return aioredis.Redis.from_url(client_url(), health_check_interval=30, retry=retry)
