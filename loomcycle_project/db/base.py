"""Django's PostgreSQL backend, whose psycopg pool checks a connection before
lending it, without a round trip, and which calls `on_rollback` callbacks.

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

`on_rollback` is the mirror of Django's `on_commit`, which Django lacks: a callback
registered inside a transaction runs when that transaction, or a savepoint that was
active at registration, rolls back (or the connection closes with the transaction
open: the server rolls it back), and is forgotten when the transaction commits.
`apps.runs.rollback` uses it to give back a fairness slot that Redis, not being
transactional, would otherwise keep until the reconcile sweep. Each callback runs
inside Django's rollback path, so it must not raise; one that does is logged.
"""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Callable
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from django.db.transaction import TransactionManagementError

log = logging.getLogger("loomcycle.db")


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


def application_name(pid: int | None = None) -> str:
    """The libpq application_name of this process's connections, `loomcycle:<pid>`, so
    `pg_stat_activity` tells which web, worker or beat process holds a connection."""
    return f"loomcycle:{os.getpid() if pid is None else pid}"


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        """Django's, with `application_name` (application_name()) unless the database URL's
        options or PGAPPNAME name one. Read when this process first connects (after a fork)."""
        params: dict[str, Any] = super().get_connection_params()
        if "application_name" not in params and not os.environ.get("PGAPPNAME"):
            params["application_name"] = application_name()
        return params

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (savepoint ids active at registration, callback), as Django's run_on_commit
        self.run_on_rollback: list[tuple[set[str], Callable[[], None]]] = []

    def on_rollback(self, func: Callable[[], None]) -> None:
        """Call `func` if the current transaction, or any savepoint active now, rolls back."""
        if not self.in_atomic_block:
            raise TransactionManagementError("on_rollback() needs a transaction (an atomic block)")
        self.run_on_rollback.append((set(self.savepoint_ids), func))

    def savepoint_rollback(self, sid: str) -> None:
        super().savepoint_rollback(sid)
        undone = [func for sids, func in self.run_on_rollback if sid in sids]
        self.run_on_rollback = [(sids, func) for sids, func in self.run_on_rollback if sid not in sids]
        _run_rollback_hooks(undone)

    def commit(self) -> None:
        super().commit()
        self.run_on_rollback = []

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:  # a failed ROLLBACK is followed by close(): the server rolls back all the same
            self._rolled_back()

    def close(self) -> None:
        try:
            super().close()
        finally:  # closed with a transaction open: the server rolls it back
            self._rolled_back()

    def _rolled_back(self) -> None:
        undone, self.run_on_rollback = self.run_on_rollback, []
        _run_rollback_hooks([func for _, func in undone])

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


def _run_rollback_hooks(funcs: list[Callable[[], None]]) -> None:
    for func in funcs:
        try:
            func()
        except Exception:  # inside Django's rollback path: never raise, say what failed
            log.exception("an on_rollback callback failed")
