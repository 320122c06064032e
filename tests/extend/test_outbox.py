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
from django.db import InterfaceError, connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.core.redis import sync_client
from apps.core.types import Principal
from apps.gateway.fairness.config import RUNS_KEY
from apps.runs import engine, services, signals
from apps.runs import store as runs_store
from apps.runs.models import Run, RunStatus, SignalOutbox
from apps.runs.tasks import run_leases_sweep_task
from loomcycle_project.extend import run_create
from tests.factories.extend import drive

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
    monkeypatch.setattr(signals, "deliver_all", lambda deliveries, **kw: None)  # the worker dies after each step commit
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
    # The runtime's own receivers are the channel bridge's, on the two interruption signals
    # (apps/channels/bridge.py), which this run never sends; the run lifecycle has none.
    own = {"interruption_pending", "interruption_resolved"}
    assert not any(s.has_listeners(Run) for name, s in signals.SIGNALS.items() if name not in own)
    with CaptureQueriesContext(connection) as queries:
        run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-quiet")
    assert queries.captured_queries and not any("signaloutbox" in q["sql"] for q in queries.captured_queries)
    assert drive(run).status == RunStatus.COMPLETED
    assert not SignalOutbox.objects.exists()
    assert Run.objects.filter(id=run.id).exists()


def test_run_finished_receivers_run_last_and_a_failed_delete_aborts_nothing(
    monkeypatch: pytest.MonkeyPatch, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's after-commit work (the fairness slot here) is done before the deployment's receivers
    run; an InterfaceError deleting the outbox row is logged and leaves the row to the sweep."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs_per_user=5)
    slot_held_at_send: list[bool] = []

    def on_finished(sender: Any, run_id: str, **kwargs: Any) -> None:
        slot_held_at_send.append(bool(sync_client().hexists(RUNS_KEY, run_id)))

    def lost(*, delivery_id: int) -> None:
        raise InterfaceError("connection already closed")

    signals.run_finished.connect(on_finished)
    try:
        run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-last")
        monkeypatch.setattr(runs_store, "outbox_delete", lost)
        assert drive(run).status == RunStatus.COMPLETED
    finally:
        signals.run_finished.disconnect(on_finished)
    assert slot_held_at_send == [False]
    assert not sync_client().hexists(RUNS_KEY, run.id)
    assert list(SignalOutbox.objects.values_list("signal", flat=True)) == ["run_finished"]  # for the sweep
    assert any("failed; the sweep will re-send it" in r.getMessage() for r in caplog.records)


def test_a_cancelled_tree_signals_run_finished_once_every_run_of_it_is_finished() -> None:
    parent = run_create(agent="spawner", prompt="go", user_id="u-tree")
    engine.run_iterate(run_id=parent.id, step=0)  # spawns its child and parks; the child stays queued here
    child = Run.objects.get(parent_id=parent.id)
    statuses_at_send: dict[str, dict[str, str]] = {}

    def on_finished(sender: Any, run_id: str, **kwargs: Any) -> None:
        rows = Run.objects.filter(id__in=[parent.id, child.id])
        statuses_at_send[run_id] = dict(rows.values_list("id", "status"))

    signals.run_finished.connect(on_finished)
    try:
        services.run_cancel(principal=Principal("", "t", frozenset({"substrate:admin"})), agent_id=parent.agent_id)
    finally:
        signals.run_finished.disconnect(on_finished)
    cancelled = {parent.id: RunStatus.CANCELLED, child.id: RunStatus.CANCELLED}
    assert statuses_at_send == {parent.id: cancelled, child.id: cancelled}


def test_an_outbox_row_is_stamped_at_its_insert_not_at_its_transaction_start() -> None:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT now()")
        (started,) = cur.fetchone()
        delivery_id = runs_store.outbox_insert(signal="run_created", run_id="r_0000000000000000", kwargs={})
        cur.execute("SELECT created_at FROM runs_signaloutbox WHERE id = %s", [delivery_id])
        (stamped,) = cur.fetchone()
        transaction.set_rollback(True)
    assert stamped > started
