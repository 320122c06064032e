"""Django's PostgreSQL backend, whose psycopg pool checks a connection before
lending it, without a round trip.

After a Postgres restart (or a terminated backend) every idle pooled
connection is dead, and each would fail the first statement that borrows it:
a 503 in the web process, a lost iteration in a worker. Django's
`CONN_HEALTH_CHECKS` makes the pool run `ConnectionPool.check_connection`, an
empty query, at every checkout: ~70 us of CPU each here, and an iteration
borrows several. A server that ends a session sends a FATAL message and
closes the socket, so an idle connection whose socket has something to read
is suspect: only then is the empty-query check run (it reads the message and
raises if the session is gone; anything benign, such as a parameter-status
message, passes). A connection cut without a word from the server (a network
partition) still fails on first use; the engine retries its statements
(apps.runs.store.hot._hot).

The pool is built as Django 5.2 builds it (`DatabaseWrapper.pool`); only the
`check` callback differs. That copy uses two private members of Django's
wrapper, `_connection_pools` and `_configure_connection`: re-check it when
Django is upgraded (tests/runs/test_db_restart.py fails if it breaks).
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base


def check_idle_connection(conn: Any, pool: Any = None) -> None:
    """psycopg pool `check`: raise if `conn` is gone; a round trip only when its
    socket is readable. A dead one means the server restarted and every idle
    connection of `pool` is dead too: they are all dropped now (`pool.check()`),
    because psycopg's checkout drops one per backoff step and a full pool would
    outlast the checkout wait (a PoolTimeout: 503s in the web process)."""
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the pooled connection is closed")
    # poll, not select: select() refuses descriptors past 1023, which a web or
    # worker process holding many streams or provider sockets reaches.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if not poller.poll(0):
        return
    try:  # unasked-for input on an idle connection: usually the server saying goodbye
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        if pool is not None:
            pool.check()
        raise


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        django: Any = self  # the private members below are not in django-stubs
        pools: dict[str, Any] = django._connection_pools
        if self.alias not in pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            from psycopg_pool import ConnectionPool

            options = {} if pool_options is True else dict(pool_options)
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django: it sets the real value later
            made: list[Any] = []  # the pool itself, for its check callback

            def check(conn: Any) -> None:
                check_idle_connection(conn, made[0] if made else None)

            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=django._configure_connection,
                check=check,
                **options,
            )
            made.append(pool)
            pools.setdefault(self.alias, pool)  # the first thread's pool wins, as in Django
        return pools[self.alias]
