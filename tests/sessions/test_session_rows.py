"""Session rows without workers (the engine is not needed): Postgres refuses a
second live run in a session, the lease sweep's backstop starts an enqueued run
whose promotion was lost, and a replayed history never separates a tool_use
from its result."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from apps.core.errors import Conflict
from apps.core.redact import runtime_redactor
from apps.runs import backpressure, create, operations, services, store
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from apps.runs.sessions import promotion, replay
from apps.runs.sessions import services as session_services
from tests.conftest import ALICE

pytestmark = pytest.mark.usefixtures("agents", "no_workers")


def start(**kw: str) -> Run:
    segments = [Segment(text="P MOCK_SCRIPT: " + json.dumps([{"text": "x"}]))]
    return services.run_create(principal=ALICE, data=services.RunCreate(agent="scripted", segments=segments, **kw))


def enqueue(session_id: str) -> Run:
    data = services.RunCreate(agent="", segments=[Segment(text="later")], multitask_strategy="enqueue")
    return session_services.session_continue(principal=ALICE, session_id=session_id, data=data)


def test_a_second_live_run_in_a_session_is_refused_by_postgres() -> None:
    live = start()
    queued = enqueue(live.session_id)
    assert Run.objects.get(id=queued.id).status == RunStatus.WAITING_SESSION
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        Run.objects.filter(id=queued.id).update(status=RunStatus.QUEUED)  # around the lock: the index says no
    assert "run_session_live" in str(refused.value)
    services.run_cancel(principal=ALICE, run_id=queued.id)
    services.run_cancel(principal=ALICE, run_id=live.id)


def test_the_sweep_starts_an_enqueued_run_whose_promotion_was_lost() -> None:
    live = start()
    queued = enqueue(live.session_id)
    with transaction.atomic():  # the live run ends with no after-commit hook: as if its process died
        store.cancel(run_id=live.id, reason="lost", redactor=runtime_redactor())
    assert Run.objects.get(id=queued.id).status == RunStatus.WAITING_SESSION
    assert promotion.sessions_promote_sweep() == 1
    assert Run.objects.get(id=queued.id).status == RunStatus.QUEUED
    assert promotion.sessions_promote_sweep() == 0  # promoted once
    services.run_cancel(principal=ALICE, run_id=queued.id)


def test_a_cancelled_live_run_starts_the_next_enqueued_one_in_order() -> None:
    live = start()
    first, second = enqueue(live.session_id), enqueue(live.session_id)
    assert (first.session_turn, second.session_turn) == (1, 2)
    services.run_cancel(principal=ALICE, run_id=live.id)  # unleased: finished here, its hook promotes
    assert Run.objects.get(id=first.id).status == RunStatus.QUEUED
    assert Run.objects.get(id=second.id).status == RunStatus.WAITING_SESSION
    services.run_cancel(principal=ALICE, run_id=second.id)  # an enqueued run can be cancelled
    services.run_cancel(principal=ALICE, run_id=first.id)
    assert Run.objects.get(id=second.id).status == RunStatus.CANCELLED


def test_history_repair_answers_every_unanswered_tool_use() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "Channel", "input": {}}
    rows = [("user", [{"type": "text", "text": "hi"}]), ("assistant", [use]), ("user", [{"type": "text", "text": "x"}])]
    repaired = replay.history_repaired(rows)
    assert repaired[2] == (
        "user",
        [{"type": "tool_result", "tool_use_id": "t1", "content": replay.NO_RESULT, "is_error": True}],
    )
    answered = [*rows[:2], ("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}])]
    assert replay.history_repaired(answered) == answered


def test_retrying_a_failed_run_while_a_later_turn_of_its_session_is_busy_is_409() -> None:
    failed = start()
    Run.objects.filter(id=failed.id).update(status=RunStatus.FAILED)  # as its worker would have left it
    live = services.run_create(
        principal=ALICE,
        data=services.RunCreate(agent="scripted", segments=[Segment(text="next")], session_id=failed.session_id),
    )
    with pytest.raises(Conflict) as busy:
        operations.run_retry(principal=ALICE, run_id=failed.id)
    assert busy.value.code == "retry_not_latest_turn"  # the live run is a later turn
    assert Run.objects.get(id=failed.id).status == RunStatus.FAILED
    services.run_cancel(principal=ALICE, run_id=live.id)


def interrupt(session_id: str) -> Run:
    data = services.RunCreate(agent="", segments=[Segment(text="now")], multitask_strategy="interrupt")
    return session_services.session_continue(principal=ALICE, session_id=session_id, data=data)


def test_an_interrupt_flags_the_runs_it_displaces_in_its_own_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    live = start()
    queued = enqueue(live.session_id)
    lost: list[object] = []
    monkeypatch.setattr(create, "_session_cancel", lambda *a: lost.append(a))  # the process dies after commit
    with transaction.atomic():
        new = interrupt(live.session_id)
        flags = set(Run.objects.filter(id__in=[live.id, queued.id]).values_list("cancel_requested", "cancel_reason"))
        assert flags == {(True, "multitask_strategy=interrupt")}  # written by the transaction that inserts `new`
    assert lost  # the after-commit finish never ran: the flags alone must end them
    assert Run.objects.get(id=live.id).status == RunStatus.QUEUED  # a worker's claim finishes it (cancel check)
    assert services.run_parked_cancels_finish() >= 1  # the enqueued one, parked: the sweep finishes it
    assert Run.objects.get(id=queued.id).status == RunStatus.CANCELLED
    assert Run.objects.get(id=new.id).status == RunStatus.WAITING_SESSION  # behind the live one, not promoted
    monkeypatch.undo()
    services.run_cancel(principal=ALICE, run_id=live.id)  # as the claim would: its end promotes `new`
    assert Run.objects.get(id=new.id).status == RunStatus.QUEUED
    services.run_cancel(principal=ALICE, run_id=new.id)


def test_a_flagged_enqueued_run_is_never_promoted() -> None:
    live = start()
    displaced = enqueue(live.session_id)
    store.session_cancel_mark(run_ids=[displaced.id], reason="test")  # an interrupt's flag, its finish lost
    later = enqueue(live.session_id)
    services.run_cancel(principal=ALICE, run_id=live.id)
    assert Run.objects.get(id=displaced.id).status == RunStatus.WAITING_SESSION  # skipped: the sweep ends it
    assert Run.objects.get(id=later.id).status == RunStatus.QUEUED
    services.run_cancel(principal=ALICE, run_id=later.id)
    services.run_parked_cancels_finish()
    assert Run.objects.get(id=displaced.id).status == RunStatus.CANCELLED


def test_an_enqueue_committed_after_the_live_run_ended_still_starts() -> None:
    live = start()
    with transaction.atomic():
        queued = enqueue(live.session_id)  # decided `waiting_session`: the live run is in flight
        # Meanwhile, on another connection, the live run ends: its session_next finds no waiting row yet.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(_cancel_elsewhere, live.id).result()
        assert Run.objects.get(id=queued.id).status == RunStatus.WAITING_SESSION
    assert Run.objects.get(id=live.id).status == RunStatus.CANCELLED
    assert Run.objects.get(id=queued.id).status == RunStatus.QUEUED  # promoted after its own commit
    services.run_cancel(principal=ALICE, run_id=queued.id)


def _cancel_elsewhere(run_id: str) -> None:
    try:
        services.run_cancel(principal=ALICE, run_id=run_id)
    finally:
        connection.close()


def test_withdrawing_a_sessions_waiting_slot_run_starts_the_one_enqueued_behind_it(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs=1, max_queue_depth=50)
    filler = start()  # takes the one slot (or waits: either way the next run waits for a slot)
    waiting = start()
    assert Run.objects.get(id=waiting.id).status == RunStatus.WAITING_SLOT
    behind = enqueue(waiting.session_id)
    assert Run.objects.get(id=behind.id).status == RunStatus.WAITING_SESSION
    assert backpressure.withdraw_waiting(waiting.id)  # its streaming client left
    assert Run.objects.get(id=behind.id).status == RunStatus.WAITING_SLOT  # now in the admission queue
    services.run_cancel(principal=ALICE, run_id=behind.id)
    services.run_cancel(principal=ALICE, run_id=filler.id)


def test_only_a_sessions_latest_turn_can_be_retried() -> None:
    old = start()
    Run.objects.filter(id=old.id).update(status=RunStatus.FAILED)  # as its worker would have left it
    newer = services.run_create(
        principal=ALICE,
        data=services.RunCreate(agent="scripted", segments=[Segment(text="next")], session_id=old.session_id),
    )
    Run.objects.filter(id=newer.id).update(status=RunStatus.COMPLETED)  # the session is idle, one turn on
    with pytest.raises(Conflict) as late:
        operations.run_retry(principal=ALICE, run_id=old.id)
    assert late.value.code == "retry_not_latest_turn"
    assert Run.objects.get(id=old.id).status == RunStatus.FAILED


def test_history_repair_is_linear_in_the_rows() -> None:
    """Many answered tool calls: one pass (the former per-call slice of the rest was quadratic)."""
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for i in range(20_000):
        rows.append(("assistant", [{"type": "tool_use", "id": f"t{i}", "name": "Context", "input": {}}]))
        rows.append(("user", [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}]))
    rows.append(("assistant", [{"type": "tool_use", "id": "last", "name": "Context", "input": {}}]))
    started = time.process_time()  # CPU time: a loaded host waits, it does not count
    repaired = replay.history_repaired(rows)
    assert time.process_time() - started < 2.0  # linear: ~0.2 s; the quadratic pass took 4.8 s
    assert repaired[:-1] == rows and repaired[-1][1][0]["tool_use_id"] == "last"
