"""kombu's Redis transport, with one reused client per channel.

kombu's Redis `Channel` builds a new `redis.Redis` object for every
synchronous operation (each publish, ack and QoS update): ~150 us of Python
per object, several per iteration. A `redis.Redis` over a connection pool is
thread-safe (each command borrows a pooled connection), so one client per
channel and pool serves them all. Registered as the `redis` transport in
workers.celery, for every process that uses our Celery app.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _lc_client: tuple[Any, Any] | None = None  # (pool, client)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        cached = self._lc_client
        if cached is None or cached[0] is not pool:  # a reconnect replaces the pool
            cached = self._lc_client = (pool, super()._create_client())  # type: ignore[misc]
        return cached[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
