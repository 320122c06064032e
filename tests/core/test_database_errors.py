"""A lost database connection (a Postgres restart) is told from other database errors: the API
answers it 503 `database_unavailable` with Retry-After, anything else stays a logged 500."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test import RequestFactory

from apps.core.database import connection_lost
from loomcycle_project.api import on_database_error


def _terminated() -> psycopg.OperationalError:
    """The error a query meets on a connection whose backend was terminated, as a restart does."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as own:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (own.info.backend_pid,))
        try:
            own.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            return exc
    raise AssertionError("the terminated connection answered")


def _timed_out() -> psycopg.OperationalError:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as own:
        own.execute("SET statement_timeout = 1")
        try:
            own.execute("SELECT pg_sleep(1)")
        except psycopg.OperationalError as exc:
            return exc
    raise AssertionError("the statement did not time out")


def test_a_lost_connection_is_a_503_and_a_statement_timeout_a_500() -> None:
    lost, timeout = _terminated(), _timed_out()
    assert connection_lost(lost) and not connection_lost(timeout)
    wrapped = OperationalError(str(lost))
    wrapped.__cause__ = lost  # as Django wraps a driver error
    request = RequestFactory().get("/v1/runs")
    unavailable = on_database_error(request, wrapped)
    assert unavailable.status_code == 503 and unavailable["Retry-After"] == "2"
    assert b'"database_unavailable"' in unavailable.content
    wrapped_timeout = OperationalError(str(timeout))
    wrapped_timeout.__cause__ = timeout
    assert on_database_error(request, wrapped_timeout).status_code == 500


@pytest.mark.django_db
def test_a_process_connections_name_it_in_pg_stat_activity(monkeypatch: pytest.MonkeyPatch) -> None:
    """`loomcycle:<pid>`, so an operator (and the chaos harness) can tell whose session is whose."""
    with connection.cursor() as cur:
        cur.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        assert cur.fetchone() == (f"loomcycle:{os.getpid()}",)
    monkeypatch.setenv("PGAPPNAME", "operator-chosen")
    assert "application_name" not in connection.get_connection_params()  # libpq takes PGAPPNAME
