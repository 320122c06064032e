"""Lost wake-ups: input or a cancel that lands while a worker commits the step
that parks the run. The race is held open with the run's row lock (the step
commit waits for it), never with sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import transaction

from apps.runs import services
from apps.runs.models import Run, RunStatus
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.runs import assert_consecutive, event_types, start
from tests.procs import WorkerPool
from tests.runs.locks import run_updates_waiting

pytestmark = pytest.mark.usefixtures("agents")


# The step commit may queue for the row lock behind the worker's lease heartbeat,
# which waits for the test's lock: any lock wait of the step commit is the test's.
def _step_commit_waiting() -> bool:
    return run_updates_waiting("r") > 0


@contextmanager
def step_commit_held(run_id: str) -> Iterator[None]:
    """Lock the run's row, wait until the worker's step commit waits for that
    lock, then run the body in the same transaction: what the body writes is
    committed just before the step commit goes on (and the step commit sees it)."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(id=run_id).values_list("id", flat=True).get()
        wait_for(_step_commit_waiting, timeout=20)
        yield


def _claimed(run_id: str) -> bool:
    return bool(run_row(run_id).lease_owner)


def test_input_sent_while_the_step_commits_is_consumed_not_left_waiting(stack: WorkerPool) -> None:
    run = start("chat-slow")  # one 1 s provider call per turn
    wait_for(lambda: _claimed(run.id))  # the claim has read pending_inputs (0)
    with step_commit_held(run.id):
        services.run_input(principal=ALICE, run_id=run.id, text="while you were answering")
    row = wait_for(lambda: (r := run_row(run.id)).step == 2 and r.status == RunStatus.AWAITING_INPUT and r, timeout=20)
    assert row.pending_inputs == 0
    assert event_types(run.id) == [
        "user_input",
        "started",
        "text",
        "usage",
        "awaiting_input",
        "user_input",
        "text",
        "usage",
        "awaiting_input",
    ]
    assert_consecutive(run.id)


def test_cancel_landing_while_the_step_commits_finishes_the_run(stack: WorkerPool) -> None:
    run = start("chat-slow")
    wait_for(lambda: _claimed(run.id))
    with step_commit_held(run.id):  # the provider call is over: only the step commit is left
        out = services.run_cancel(principal=ALICE, agent_id=run.agent_id)
        # The lease is live (3 s, the call took 1 s): the cancel went to the worker as a signal.
        assert run_row(run.id).status == RunStatus.RUNNING
    assert out["cancelled"] is True
    done = wait_status(run.id, RunStatus.CANCELLED, timeout=10)
    assert done.stop_reason == "cancelled by api" and done.lease_until is None
    assert event_types(run.id)[-1] == "done"
    assert_consecutive(run.id)


def test_sweeper_finishes_a_parked_run_whose_cancel_had_not_landed(stack: WorkerPool) -> None:
    run = start("chat")
    wait_status(run.id, RunStatus.AWAITING_INPUT)
    # What a cancel that met the park left behind before the step commit checked the flag.
    Run.objects.filter(id=run.id).update(cancel_requested=True, cancel_reason="cancelled by api")
    done = wait_status(run.id, RunStatus.CANCELLED, timeout=10)  # beat sweeps every second in tests
    assert done.stop_reason == "cancelled by api"
    assert event_types(run.id)[-1] == "done"
    assert_consecutive(run.id)
