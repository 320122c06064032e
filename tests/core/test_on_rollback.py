"""`connection.on_rollback` of the project's database backend (loomcycle_project/db/base.py):
the mirror of Django's `on_commit`, which apps.runs.rollback uses to give back fairness slots."""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    """The caller's failure that rolls its block back."""


def test_an_outer_rollback_calls_every_callback_and_a_commit_calls_none() -> None:
    called: list[str] = []
    with pytest.raises(Boom), transaction.atomic():
        connection.on_rollback(lambda: called.append("outer"))
        with transaction.atomic():
            connection.on_rollback(lambda: called.append("inner"))
        raise Boom
    assert called == ["outer", "inner"]

    with transaction.atomic():
        connection.on_rollback(lambda: called.append("committed"))
    with pytest.raises(Boom), transaction.atomic():  # the next transaction on this connection
        raise Boom
    assert called == ["outer", "inner"]  # forgotten at the commit, never called later


def test_a_savepoint_rollback_calls_only_what_was_registered_inside_it() -> None:
    called: list[str] = []
    with transaction.atomic():
        connection.on_rollback(lambda: called.append("before"))
        with pytest.raises(Boom), transaction.atomic():
            connection.on_rollback(lambda: called.append("inside"))
            raise Boom
        assert called == ["inside"]  # at the savepoint's exit, not at the end of the transaction
        with transaction.atomic():
            connection.on_rollback(lambda: called.append("released savepoint"))
    assert called == ["inside"]  # the transaction committed


def test_a_raising_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    called: list[str] = []

    def broken() -> None:
        raise RuntimeError("redis is down")

    with caplog.at_level(logging.ERROR, logger="loomcycle.db"), pytest.raises(Boom), transaction.atomic():
        connection.on_rollback(broken)
        connection.on_rollback(lambda: called.append("after"))
        raise Boom
    assert called == ["after"]
    assert "on_rollback callback failed" in caplog.text and "redis is down" in caplog.text


def test_a_connection_closed_inside_the_transaction_counts_as_a_rollback() -> None:
    called: list[str] = []
    with pytest.raises(Boom), transaction.atomic():
        connection.on_rollback(lambda: called.append("closed"))
        connection.close()
        assert called == ["closed"]  # the server rolls back a transaction whose session ended
        raise Boom
    assert called == ["closed"]


def test_outside_a_transaction_it_is_refused() -> None:
    with pytest.raises(TransactionManagementError, match="needs a transaction"):
        connection.on_rollback(lambda: None)
