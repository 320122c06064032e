"""The lifecycle signals are at least once (apps.runs.signals): with a receiver, each transition's
transaction commits an outbox row, the send after the commit deletes it, and the lease sweep re-sends
a row whose process died before deleting it, with the same `delivery_id`. Without a receiver nothing
is written. The engine runs in this process (`no_workers`)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.runs import signals
from apps.runs.models import Run, RunStatus, SignalOutbox
from apps.runs.tasks import run_leases_sweep_task
from loomcycle_project.extend import run_create
from tests.extend.test_hosttools import drive

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

SCRIPT = "MOCK_SCRIPT: " + json.dumps([{"tool": "Context", "input": {"op": "self"}}, {"text": "done"}])


@dataclasses.dataclass
class Sent:
    """One send a receiver saw, and whether its outbox row existed while the receiver ran."""

    name: str
    kwargs: dict[str, Any]
    row_during_send: bool


@pytest.fixture
def heard() -> Iterator[list[Sent]]:
    """A recording receiver on every lifecycle signal, after one that raises."""
    got: list[Sent] = []
    connected = []
    for name, signal in signals.SIGNALS.items():

        def boom(sender: Any, **kwargs: Any) -> None:
            raise RuntimeError("a broken receiver")

        def record(sender: Any, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal")
            present = SignalOutbox.objects.filter(id=kwargs["delivery_id"]).exists()
            got.append(Sent(_name, kwargs, present))

        signal.connect(boom)
        signal.connect(record)
        connected.append((signal, boom, record))
    yield got
    for signal, boom, record in connected:
        signal.disconnect(boom)
        signal.disconnect(record)


@pytest.fixture
def resend_now(settings: Any) -> None:
    """Every outbox row is past the re-send grace."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, signal_resend_seconds=0.0)


def test_each_send_deletes_its_row_after_the_receivers_ran_even_one_that_raised(heard: list[Sent]) -> None:
    run = drive(run_create(agent="scripted", prompt=SCRIPT, user_id="u-ob"))
    assert run.status == RunStatus.COMPLETED
    assert [s.name for s in heard] == ["run_created", "tool_called", "run_finished"]
    assert all(s.row_during_send for s in heard)  # sent while the row was there: send first, then delete
    assert len({s.kwargs["delivery_id"] for s in heard}) == 3
    assert not SignalOutbox.objects.exists()


def test_a_rolled_back_transition_leaves_no_row_and_sends_nothing(heard: list[Sent]) -> None:
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        run_create(agent="scripted", prompt=SCRIPT, user_id="u-ob")
        assert SignalOutbox.objects.count() == 1  # in the transition's own transaction
        _ = 1 / 0
    assert not SignalOutbox.objects.exists()
    assert heard == []


def test_a_send_lost_after_the_commit_is_resent_by_the_sweep_with_its_delivery_id(
    heard: list[Sent], settings: Any
) -> None:
    with transaction.atomic():
        run = run_create(agent="scripted", prompt=SCRIPT, tenant_id="", user_id="u-crash")
        connection.run_on_commit.clear()  # the process "dies" right after its commit: no send, no doorbell
    assert heard == []
    (row,) = SignalOutbox.objects.all()
    created = {"run_id": run.id, "tenant_id": "", "user_id": "u-crash", "parent_id": None}
    assert (row.signal, row.run_id, row.kwargs) == ("run_created", run.id, created)
    assert signals.resend_due() == 0  # within the grace (30 s): the send may still be under way
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, signal_resend_seconds=0.0)
    run_leases_sweep_task()  # beat's lease sweep runs the re-send
    assert [(s.name, s.kwargs) for s in heard] == [("run_created", {**created, "delivery_id": row.id})]
    assert not SignalOutbox.objects.exists()
    assert drive(run).status == RunStatus.COMPLETED  # its lost doorbell too: the run is not left queued


@pytest.mark.usefixtures("resend_now")
def test_an_engine_step_whose_sends_were_lost_is_resent(heard: list[Sent], monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-step")
    heard.clear()
    monkeypatch.setattr(signals, "deliver_all", lambda deliveries: None)  # the worker dies after each step commit
    assert drive(run).status == RunStatus.COMPLETED
    assert heard == []
    rows = {r.signal: r for r in SignalOutbox.objects.all()}
    assert sorted(rows) == ["run_finished", "tool_called"]
    assert signals.resend_due() == 2
    assert [(s.name, s.kwargs["delivery_id"]) for s in heard] == [
        ("tool_called", rows["tool_called"].id),
        ("run_finished", rows["run_finished"].id),
    ]
    assert heard[1].kwargs == {"run_id": run.id, "status": "completed", "delivery_id": rows["run_finished"].id}
    assert not SignalOutbox.objects.exists()


@pytest.mark.usefixtures("resend_now")
def test_a_row_whose_signal_has_no_receiver_here_is_deleted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    def gone(sender: Any, **kwargs: Any) -> None:
        raise AssertionError("not connected at the sweep")

    signals.run_created.connect(gone)
    try:
        with transaction.atomic():
            run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-gone")
            connection.run_on_commit.clear()
    finally:
        signals.run_created.disconnect(gone)  # the app that connected it was removed
    assert SignalOutbox.objects.filter(run_id=run.id).count() == 1
    with caplog.at_level(logging.WARNING, logger="loomcycle.runs.signals"):
        assert signals.resend_due() == 1
    assert not SignalOutbox.objects.exists()
    assert any("no receiver in this process; deleted unsent" in r.getMessage() for r in caplog.records)
    assert drive(run).status == RunStatus.COMPLETED


def test_without_a_receiver_no_row_is_written_and_no_query_names_the_outbox() -> None:
    assert not signals.listening()
    with CaptureQueriesContext(connection) as queries:
        run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-quiet")
    assert queries.captured_queries and not any("signaloutbox" in q["sql"] for q in queries.captured_queries)
    assert drive(run).status == RunStatus.COMPLETED
    assert not SignalOutbox.objects.exists()
    assert Run.objects.filter(id=run.id).exists()
