"""Session rows without workers (the engine is not needed): Postgres refuses a
second live run in a session, the lease sweep's backstop starts an enqueued run
whose promotion was lost, and a replayed history never separates a tool_use
from its result."""

from __future__ import annotations

import json

import pytest
from django.db import IntegrityError, transaction

from apps.core.errors import Conflict
from apps.core.redact import runtime_redactor
from apps.runs import operations, services, session_services, sessions, store
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
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
    assert sessions.sessions_promote_sweep() == 1
    assert Run.objects.get(id=queued.id).status == RunStatus.QUEUED
    assert sessions.sessions_promote_sweep() == 0  # promoted once
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
    repaired = sessions.history_repaired(rows)
    assert repaired[2] == (
        "user",
        [{"type": "tool_result", "tool_use_id": "t1", "content": sessions.NO_RESULT, "is_error": True}],
    )
    answered = [*rows[:2], ("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}])]
    assert sessions.history_repaired(answered) == answered


def test_retrying_a_failed_run_while_its_session_is_busy_is_409() -> None:
    failed = start()
    Run.objects.filter(id=failed.id).update(status=RunStatus.FAILED)  # as its worker would have left it
    live = services.run_create(
        principal=ALICE,
        data=services.RunCreate(agent="scripted", segments=[Segment(text="next")], session_id=failed.session_id),
    )
    with pytest.raises(Conflict) as busy:
        operations.run_retry(principal=ALICE, run_id=failed.id)
    assert busy.value.code == "session_busy"
    assert Run.objects.get(id=failed.id).status == RunStatus.FAILED
    services.run_cancel(principal=ALICE, run_id=live.id)
