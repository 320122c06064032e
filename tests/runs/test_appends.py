"""Event seqs and transcript indexes stay consecutive when the paths that append
to a run race (apps.runs.store's one append primitive): answers to parked calls
and a cancel queue on the run's row lock, which the test holds until all of them
wait (seen in pg_stat_activity, never with sleeps), then lands in any order."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.wake import run_answer
from tests.conftest import ALICE, run_row, wait_for
from tests.factories.runs import assert_consecutive, event_types, start

pytestmark = pytest.mark.usefixtures("agents")


def _lock_waiters() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # pg_stat_activity is otherwise frozen per transaction
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(cur.fetchone()[0])


def _in_thread(work: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test, which fails on it
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def _answer(run_id: str, call_id: str) -> None:
    with transaction.atomic():
        run_answer(run_id=run_id, call_id=call_id, tool_name="Channel", text=f"answer {call_id}", is_error=False)


def test_answers_and_a_cancel_racing_on_a_parked_run_append_consecutive_seqs() -> None:
    with transaction.atomic():  # parked before its doorbell rings (on commit): no worker can claim it
        run = start("chat")
        # Parked on three calls: two answers cannot wake it.
        Run.objects.filter(id=run.id).update(status=RunStatus.WAITING_CHANNEL, pending_calls=3)
    errors: list[BaseException] = []
    with transaction.atomic():
        Run.objects.select_for_update().filter(id=run.id).values_list("id", flat=True).get()
        threads = [
            _in_thread(lambda: _answer(run.id, "call_1"), errors),
            _in_thread(lambda: services.run_cancel(principal=ALICE, agent_id=run.agent_id), errors),
            _in_thread(lambda: _answer(run.id, "call_2"), errors),
        ]
        wait_for(lambda: _lock_waiters() >= 3, timeout=20)
    for thread in threads:
        thread.join(timeout=20)
    assert errors == []
    done = run_row(run.id)
    assert done.status == RunStatus.CANCELLED
    types = event_types(run.id)
    assert types[-1] == "done" and types.count("done") == 1
    answered = types.count("tool_result")  # the answers that locked the run before the cancel did
    assert done.pending_calls == 3 - answered and done.transcript_len == 1 + answered
    assert done.last_seq == RunEvent.objects.filter(run_id=run.id).count()
    assert_consecutive(run.id)
