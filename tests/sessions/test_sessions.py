"""Sessions (SPEC 2.3, 4.5; issue 22): continuation replays exactly the stored
history, `session_id` on a new run appends without replay, one run in flight
per session, and each `multitask_strategy`. Real workers run the mock-script
agent `scripted`; its `echo` step answers with the messages the model got."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.core.errors import Conflict, NotFound, Unprocessable
from apps.core.types import Principal
from apps.runs import services
from apps.runs.compacted import MARKER_ROLE, SUMMARY_HEADER
from apps.runs.fork import ForkRequest, run_fork
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment, messages_from_rows
from apps.runs.sessions import services as session_services
from tests.conftest import ALICE, wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "stack")

PARK = {"op": "subscribe", "channel": "handoff", "wait_ms": 120_000, "max_messages": 1}


def prompt(text: str, steps: list[dict[str, Any]]) -> list[Segment]:
    return [Segment(text=f"{text} MOCK_SCRIPT: {json.dumps(steps)}")]


def start(text: str, steps: list[dict[str, Any]], **kw: Any) -> Run:
    data = services.RunCreate(agent="scripted", segments=prompt(text, steps), user_id="u1", **kw)
    return services.run_create(principal=ALICE, data=data)


def say(session_id: str, text: str, steps: list[dict[str, Any]], who: Principal = ALICE, **kw: Any) -> Run:
    """POST /v1/sessions/{id}/messages, in-process."""
    data = services.RunCreate(agent="", segments=prompt(text, steps), **kw)
    return session_services.session_continue(principal=who, session_id=session_id, data=data)


def echoed(run: Run) -> list[dict[str, str]]:
    """The messages the run's model received (its echo step's answer)."""
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    (text,) = [e.payload["text"] for e in RunEvent.objects.filter(run_id=done.id, type="text")]
    return list(json.loads(text)["messages"])


def as_echo(run_ids: list[str]) -> list[dict[str, str]]:
    """The stored transcript rows of these runs, merged as the engine merges them, in echo's form."""
    rows = [(t.role, t.content) for r in run_ids for t in TranscriptEntry.objects.filter(run_id=r).order_by("idx")]
    texts = [
        {"role": m["role"], "text": "\n".join(b["text"] for b in m["content"] if b["type"] == "text")}
        for m in messages_from_rows(rows)
    ]
    return texts


def parked(text: str = "P1", **kw: Any) -> Run:
    run = start(text, [{"tool": "Channel", "input": PARK}], **kw)
    wait_status(run.id, RunStatus.WAITING_CHANNEL, timeout=30)
    return run


def test_continuation_replays_exactly_the_stored_history(stack: WorkerPool) -> None:
    first = start("P0", [{"tool": "Context", "input": {"op": "time"}}, {"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    second = say(first.session_id, "P1", [{"text": "second answer"}])
    assert (second.session_id, second.session_turn, second.agent_name) == (first.session_id, 1, "scripted")
    wait_status(second.id, RunStatus.COMPLETED, timeout=30)
    third = say(first.session_id, "P2", [{"echo": True}])
    seen = echoed(third)
    # every stored row, in order, then the new turn (as_echo of `third` ends with its echo answer)
    assert seen == as_echo([first.id, second.id, third.id])[:-1]
    assert [m["text"] for m in seen if m["role"] == "assistant"] == ["", "first answer", "second answer"]
    assert seen[-1]["text"].startswith("P2 MOCK_SCRIPT")


def test_session_id_on_a_new_run_appends_without_replay(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    appended = start("P1", [{"echo": True}], session_id=first.session_id)
    assert (appended.session_id, appended.session_turn, appended.replays_session) == (first.session_id, 1, False)
    assert [m["text"][:2] for m in echoed(appended)] == ["P1"]  # its own message only
    later = say(first.session_id, "P2", [{"echo": True}])
    assert [m["text"] for m in echoed(later)][:2] == [as_echo([first.id])[0]["text"], "first answer"]


def test_reject_is_session_busy_while_a_run_is_in_flight(stack: WorkerPool) -> None:
    live = parked()
    with pytest.raises(Conflict) as busy:
        say(live.session_id, "P2", [{"text": "no"}])
    assert busy.value.code == "session_busy" and busy.value.details == {"run_id": live.id}
    with pytest.raises(Conflict):
        start("P2", [{"text": "no"}], session_id=live.session_id, multitask_strategy="reject")
    assert Run.objects.filter(session_id=live.session_id).count() == 1
    services.run_cancel(principal=ALICE, run_id=live.id)


def test_enqueue_parks_the_new_run_until_the_live_one_ends(stack: WorkerPool) -> None:
    live = parked()
    queued = say(live.session_id, "P2", [{"echo": True}], multitask_strategy="enqueue")
    also = say(live.session_id, "P3", [{"text": "third"}], multitask_strategy="enqueue")
    assert Run.objects.get(id=queued.id).status == RunStatus.WAITING_SESSION
    assert Run.objects.get(id=also.id).status == RunStatus.WAITING_SESSION
    services.run_cancel(principal=ALICE, run_id=live.id)  # its end starts the oldest enqueued run
    seen = echoed(queued)
    assert seen == as_echo([live.id, queued.id])[:-1]  # the cancelled run's turn, then its own
    assert [m["role"] for m in seen] == ["user", "assistant", "user"]
    assert Run.objects.get(id=live.id).status == RunStatus.CANCELLED
    wait_status(also.id, RunStatus.COMPLETED, timeout=30)  # then the next, in order
    assert Run.objects.get(id=queued.id).completed_at <= Run.objects.get(id=also.id).started_at


def test_interrupt_cancels_the_live_run_and_keeps_its_turn(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    live = say(first.session_id, "P1", [{"tool": "Channel", "input": PARK}])
    wait_status(live.id, RunStatus.WAITING_CHANNEL, timeout=30)
    new = say(first.session_id, "P2", [{"echo": True}], multitask_strategy="interrupt")
    seen = echoed(new)
    interrupted = Run.objects.get(id=live.id)
    assert interrupted.status == RunStatus.CANCELLED and not interrupted.session_rolled_back
    assert interrupted.stop_reason == "multitask_strategy=interrupt"
    # P0, its answer, P1, the interrupted tool call, then P2 beside the call's synthesised error result.
    assert [m["role"] for m in seen] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["text"][:2] for m in seen] == ["P0", "fi", "P1", "", "P2"]


def test_rollback_cancels_the_live_run_and_drops_its_turn(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    live = say(first.session_id, "P1", [{"tool": "Channel", "input": PARK}])
    wait_status(live.id, RunStatus.WAITING_CHANNEL, timeout=30)
    new = say(first.session_id, "P2", [{"echo": True}], multitask_strategy="rollback")
    seen = echoed(new)
    dropped = Run.objects.get(id=live.id)
    assert dropped.status == RunStatus.CANCELLED and dropped.session_rolled_back
    assert TranscriptEntry.objects.filter(run_id=live.id).count() == 2  # its rows stay
    assert [m["text"][:2] for m in seen] == ["P0", "fi", "P2"]


def test_unknown_strategy_is_422_and_writes_nothing(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    with pytest.raises(Unprocessable) as bad:
        say(first.session_id, "P1", [{"text": "x"}], multitask_strategy="later")
    assert bad.value.code == "invalid_multitask_strategy"
    assert Run.objects.filter(session_id=first.session_id).count() == 1


def test_another_tenant_or_user_never_reaches_the_session(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    other_tenant = Principal(tenant_id="beta", subject="u1", scopes=frozenset({"substrate:tenant"}))
    isolated = Principal(tenant_id="", subject="mallory", scopes=frozenset({"substrate:user"}))
    for who in (other_tenant, isolated):
        with pytest.raises(NotFound):
            say(first.session_id, "P1", [{"text": "x"}], who=who)
        with pytest.raises(NotFound):
            session_services.session_transcript(principal=who, session_id=first.session_id)
        with pytest.raises(NotFound):
            session_services.session_replay(principal=who, session_id=first.session_id, agent=None)
    with pytest.raises(NotFound):  # the same tenant, another user
        data = services.RunCreate(
            agent="scripted", segments=prompt("P1", []), user_id="u2", session_id=first.session_id
        )
        services.run_create(principal=ALICE, data=data)
    assert Run.objects.filter(session_id=first.session_id).count() == 1


def test_replay_copies_the_history_into_a_new_session_for_another_agent(stack: WorkerPool) -> None:
    first = start("P0", [{"tool": "Context", "input": {"op": "time"}}, {"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    out = session_services.session_replay(principal=ALICE, session_id=first.session_id, agent="scripted-fallback")
    seed = Run.objects.get(id=out["seed_run_id"])
    assert out["new_session_id"] == seed.session_id != first.session_id
    assert out["events_copied"] == TranscriptEntry.objects.filter(run_id=first.id).count() == 4
    assert out["compacted"] is False  # nothing of the session was compacted
    assert (seed.status, seed.stop_reason, seed.agent_name) == (
        RunStatus.COMPLETED,
        "session_replay",
        "scripted-fallback",
    )
    assert seed.completed_at is not None
    later = say(seed.session_id, "P1", [{"echo": True}])
    assert later.agent_name == "scripted-fallback"
    assert echoed(later)[:-1] == as_echo([first.id])  # the source's history, as the source had it
    with pytest.raises(Conflict) as gone:
        session_services.session_replay(principal=ALICE, session_id=first.session_id, agent="no-such-agent")
    assert gone.value.code == "agent_gone"


def test_a_fork_of_a_continuation_keeps_the_session_history_it_was_built_on(stack: WorkerPool) -> None:
    first = start("P0", [{"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    second = say(first.session_id, "P1", [{"text": "second answer"}])
    wait_status(second.id, RunStatus.COMPLETED, timeout=30)
    request = ForkRequest(from_step=0, prompt=f"P2 MOCK_SCRIPT: {json.dumps([{'echo': True}])}")
    forked = run_fork(principal=ALICE, run_id=second.id, request=request)
    seen = echoed(forked)  # what the continuation's model saw at step 0, then the fork's prompt
    assert [m["text"][:2] for m in seen] == ["P0", "fi", "P1", "se", "P2"]


def test_a_compacted_appended_turn_keeps_the_earlier_turns_in_a_continuation(
    stack: WorkerPool, http: httpx.Client
) -> None:
    first = start("P0", [{"text": "first answer"}])
    wait_status(first.id, RunStatus.COMPLETED, timeout=30)
    data = services.RunCreate(
        agent="compactor", segments=prompt("T1", [{"text": "one"}]), user_id="u1", session_id=first.session_id
    )
    appended = services.run_create(principal=ALICE, data=data)  # session_id: its own rows only, no replay
    awaiting(appended, 1)
    services.run_input(principal=ALICE, run_id=appended.id, text=prompt("T2", [{"text": "two"}])[0].text)
    awaiting(appended, 2)
    assert http.post(f"/v1/runs/{appended.id}/compact").status_code == 202
    awaiting(appended, 3)  # woken, compacted (turn one summarised), parked again
    assert TranscriptEntry.objects.filter(run_id=appended.id, role=MARKER_ROLE).count() == 1
    services.run_cancel(principal=ALICE, run_id=appended.id)
    later = say(first.session_id, "P3", [{"echo": True}])
    seen = echoed(later)
    # turn 0 whole (the marker was made against the appended run's rows only), then its compacted form
    assert [m["text"][:2] for m in seen[:2]] == ["P0", "fi"]
    assert seen[2]["text"].startswith(SUMMARY_HEADER) and seen[-1]["text"].startswith("P3")
    out = session_services.session_replay(principal=ALICE, session_id=first.session_id, agent=None)
    assert out["compacted"] is True


def awaiting(run: Run, turns: int) -> None:
    """Wait until the run has parked at awaiting_input `turns` times and is parked now."""
    wait_for(lambda: RunEvent.objects.filter(run_id=run.id, type="awaiting_input").count() >= turns, timeout=30)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
