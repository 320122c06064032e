"""Telling a lost database connection from every other database error.

A Postgres restart (or failover) breaks every open connection: psycopg raises
OperationalError with no SQLSTATE (the socket closed) or a class 08 one
(connection exception), or the server's shutdown codes (57P01 admin shutdown,
57P02 crash shutdown, 57P03 cannot connect now); psycopg_pool's PoolTimeout
(no connection within the pool's wait) is an OperationalError without one too.
None of these is the caller's fault, and the same work succeeds once the server
is back. A statement timeout (57014) or a serialization failure is not one.
"""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError

_SHUTDOWN = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: BaseException) -> bool:
    """True for the errors of a database that went away (see the module docstring)."""
    if isinstance(exc, InterfaceError | psycopg.InterfaceError):
        return True
    if not isinstance(exc, OperationalError | psycopg.OperationalError):
        return False
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    sqlstate = cause.sqlstate if isinstance(cause, psycopg.Error) else None
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in _SHUTDOWN
