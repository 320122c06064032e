"""Per-definition token bucket, cluster-wide (SPEC 9.2 step 7).

One Lua script refills and takes a token atomically in Redis, on Redis's own
clock (`TIME`), so every web process shares one bucket per definition and
clock skew between web hosts does not matter. The bucket holds at most
`burst` tokens and refills at `requests_per_minute / 60` per second; an idle
bucket expires once it would be full again. Redis unreachable is a 503
(default deny), not an unmetered delivery.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from redis import RedisError
from redis.commands.core import Script

from apps.core.redis import sync_client
from apps.triggers.webhooks.errors import RateLimited, RuntimeUnavailable

_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait_ms = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait_ms = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return wait_ms
"""


@dataclass(frozen=True)
class Limit:
    requests_per_minute: int
    burst: int


@cache
def _script() -> Script:
    return sync_client().register_script(_TAKE)  # EVALSHA, loaded again by redis-py after a Redis restart


def bucket_key(tenant_id: str, name: str) -> str:
    return f"lc:webhook:rl:{tenant_id}\x1f{name}"


def take(*, tenant_id: str, name: str, limit: Limit) -> None:
    """Take one token or raise RateLimited with a Retry-After in whole seconds."""
    try:
        wait_ms = int(_script()(keys=[bucket_key(tenant_id, name)], args=[limit.requests_per_minute / 60, limit.burst]))
    except RedisError as exc:
        raise RuntimeUnavailable("rate limiter unavailable").with_detail(f"redis: {exc}") from exc
    if wait_ms > 0:
        retry_after = max(1, math.ceil(wait_ms / 1000))
        raise RateLimited("rate limit exceeded", headers={"Retry-After": str(retry_after)}).with_detail(
            f"retry after {retry_after} s"
        )
