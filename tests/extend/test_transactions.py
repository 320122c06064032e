"""`run_create` inside the caller's transaction, and the lifecycle signals after commit.

The run exists iff the caller's transaction commits: a rollback (of the transaction,
or of a savepoint around the create) leaves no row, no event and no fairness slot; a
commit rings the doorbell and a real worker runs it. Signals go out after commit only,
and a receiver that raises is logged without touching the run (tests/extend/test_outbox.py:
the outbox that makes them at-least-once)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from apps.core.redis import sync_client
from apps.core.types import Principal
from apps.gateway import fairness
from apps.gateway.fairness.config import RUNS_KEY
from apps.runs import engine, services
from apps.runs.models import Run, RunEvent, RunStatus
from loomcycle_project.extend import run_create, signals
from tests.conftest import wait_status
from tests.factories.extend import drive
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

SCRIPT = "MOCK_SCRIPT: " + json.dumps([{"tool": "Context", "input": {"op": "self"}}, {"text": "done"}])


class Boom(Exception):
    """The receiver's own failure, which the runtime must log and survive."""


@pytest.fixture
def capped(settings: Any) -> Iterator[None]:
    """A per-user cap, so run_create takes a Redis slot for each top-level run."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs_per_user=5)
    yield


def holds_slot(run_id: str) -> bool:
    return bool(sync_client().hexists(RUNS_KEY, run_id))


def nothing_left(run_id: str) -> bool:
    return not Run.objects.filter(id=run_id).exists() and not RunEvent.objects.filter(run_id=run_id).exists()


@pytest.mark.usefixtures("capped")
def test_a_rolled_back_transaction_leaves_no_run_no_event_and_no_slot() -> None:
    created: list[str] = []
    with pytest.raises(Boom), transaction.atomic():
        run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-roll")
        created.append(run.id)
        assert holds_slot(run.id)  # taken at once: an over-cap create is refused inside the transaction
        raise Boom
    (run_id,) = created
    assert nothing_left(run_id)
    assert not holds_slot(run_id)


@pytest.mark.usefixtures("capped", "no_workers")  # no worker claims `kept` before the cancel
def test_a_rolled_back_savepoint_gives_its_slot_back_and_the_outer_commit_keeps_the_other() -> None:
    with transaction.atomic():
        kept = run_create(agent="scripted", prompt=SCRIPT, user_id="u-sp")
        with pytest.raises(Boom), transaction.atomic():
            dropped = run_create(agent="scripted", prompt=SCRIPT, user_id="u-sp")
            raise Boom
        assert not holds_slot(dropped.id)  # the savepoint's rollback released it, before the outer commit
    assert nothing_left(dropped.id)
    assert Run.objects.filter(id=kept.id).exists() and holds_slot(kept.id)
    services.run_cancel(principal=Principal("", "t", frozenset({"substrate:admin"})), agent_id=kept.agent_id)
    assert not holds_slot(kept.id)


@pytest.mark.usefixtures("capped")
def test_a_committed_transaction_rings_the_doorbell_and_a_worker_runs_it(stack: WorkerPool) -> None:
    with transaction.atomic():
        run = run_create(agent="scripted", prompt=SCRIPT, user_id="u-commit")
        assert not Run.objects.exclude(status=RunStatus.QUEUED).filter(id=run.id).exists()
    assert wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    fairness.run_slot_release(run.id)  # the worker runs without the cap this test set in its own process


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every lifecycle signal this process sends (kwargs without the `delivery_id` each carries, an
    int), with a raising receiver connected first."""
    got: list[tuple[str, dict[str, Any]]] = []
    names = ("run_created", "run_parked", "run_resumed", "run_finished", "tool_called")
    receivers = {}
    for name in names:

        def boom(sender: Any, **kwargs: Any) -> None:
            raise RuntimeError("a broken receiver")

        def record(sender: Any, _name: str = name, **kwargs: Any) -> None:
            assert isinstance(kwargs["delivery_id"], int)
            got.append((_name, {k: v for k, v in kwargs.items() if k not in ("signal", "delivery_id")}))

        receivers[name] = (boom, record)
        getattr(signals, name).connect(boom)
        getattr(signals, name).connect(record)
    yield got
    for name, (boom, record) in receivers.items():
        getattr(signals, name).disconnect(boom)
        getattr(signals, name).disconnect(record)


@pytest.mark.usefixtures("no_workers")
def test_signals_follow_the_commit_and_a_raising_receiver_changes_nothing(
    received: list[tuple[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(Boom), transaction.atomic():
        run_create(agent="scripted", prompt=SCRIPT)
        raise Boom
    assert received == []  # rolled back: nothing was sent
    with transaction.atomic():
        run = run_create(agent="scripted", prompt=SCRIPT, tenant_id="", user_id="u-sig")
        assert received == []  # not before the commit
    created = {"run_id": run.id, "tenant_id": "", "user_id": "u-sig", "parent_id": None}
    assert received == [("run_created", created)]
    assert drive(run).status == RunStatus.COMPLETED  # the raising receiver did not fail the run
    (call,) = [kw for name, kw in received if name == "tool_called"]
    assert (call["run_id"], call["tool"], call["is_error"]) == (run.id, "Context", False)
    assert received[-1] == ("run_finished", {"run_id": run.id, "status": RunStatus.COMPLETED})
    failed = [r for r in caplog.records if r.name == "loomcycle.runs.signals" and r.levelno == logging.ERROR]
    assert len(failed) == 3  # run_created, tool_called, run_finished: each logged with its exception
    assert all(r.exc_info and str(r.exc_info[1]) == "a broken receiver" for r in failed)


@pytest.mark.usefixtures("no_workers")
def test_parking_and_resuming_are_signalled(received: list[tuple[str, dict[str, Any]]]) -> None:
    run = run_create(agent="chat-slow", prompt="hello")
    engine.run_iterate(run_id=run.id, step=0)
    assert received[-1] == ("run_parked", {"run_id": run.id, "status": RunStatus.AWAITING_INPUT})
    principal = Principal("", "t", frozenset({"substrate:admin"}))
    services.run_input(principal=principal, run_id=run.id, text="more")
    assert received[-1] == ("run_resumed", {"run_id": run.id})
    services.run_cancel(principal=principal, agent_id=run.agent_id)
    assert received[-1] == ("run_finished", {"run_id": run.id, "status": RunStatus.CANCELLED})


def _raise_boom() -> None:
    raise Boom


@pytest.mark.usefixtures("capped", "no_workers")
def test_a_committed_run_keeps_its_slot_when_an_earlier_on_commit_callback_raises() -> None:
    """Django drops the on_commit callbacks after one that raises; the commit happened all the same, so the
    slot stays (the backend's on_rollback callbacks are forgotten at the commit, whatever on_commit does)."""
    created: list[Run] = []
    with pytest.raises(Boom), transaction.atomic():
        transaction.on_commit(_raise_boom)
        created.append(run_create(agent="scripted", prompt=SCRIPT, user_id="u-early-boom"))
    (run,) = created
    assert Run.objects.filter(id=run.id).exists()
    assert holds_slot(run.id)
    services.run_cancel(principal=Principal("", "t", frozenset({"substrate:admin"})), agent_id=run.agent_id)
    assert not holds_slot(run.id)
