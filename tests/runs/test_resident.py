"""Resident children (the Agent tool's open/send/poll/cancel/close, SPEC 4.8, issue 22):
the parent parks as a row while its child's turn runs, the child parks at
`awaiting_input` between turns, beat's sweep closes idle children, the parent's end
closes its children, and a parent addresses only its own. Real workers and beat;
both agents play mock-script (tests/loomcycle.test.yaml: resident-parent,
resident-child). An interactive parent is given each next script as its next user
turn, once the test knows the child's id."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from apps.runs import engine, services
from apps.runs.children.resident import resident_sweep
from apps.runs.models import ResidentChild, Run, RunEvent, RunStatus
from apps.runs.presenters import agent_out
from apps.runs.prompt import Segment
from apps.runs.selectors import run_get
from apps.runs.tasks import resident_sweep_task
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.runs import ASK, assert_consecutive
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

CHILD = "resident-child"


def script(*steps: dict[str, Any]) -> str:
    return "MOCK_SCRIPT: " + json.dumps(list(steps))


def agent(**call: Any) -> dict[str, Any]:
    """One model step calling the Agent tool with `call`."""
    return {"tool": "Agent", "input": call}


def open_call(child_script: str, **extra: Any) -> dict[str, Any]:
    return agent(op="open", name=CHILD, prompt=child_script, **extra)


def parent(*steps: dict[str, Any], interactive: bool = True) -> Run:
    data = services.RunCreate(
        agent="resident-parent", segments=[Segment(text=script(*steps))], user_id="u1", interactive=interactive
    )
    return services.run_create(principal=ALICE, data=data)


def answers(run_id: str) -> list[dict[str, Any]]:
    """The parent's Agent results, in order: the JSON body (with `is_error`), or `{"error": text}`."""
    out = []
    for e in RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq"):
        if e.payload["tool_use"]["name"] != "Agent":
            continue
        text, is_error = e.payload["text"], e.payload["is_error"]
        body = json.loads(text) if text.startswith("{") else {"error": text}
        out.append({**body, "is_error": is_error})
    return out


def turn(run: Run, *steps: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Give the parked interactive parent its next script; its Agent results once it has `count`."""
    services.run_input(principal=ALICE, run_id=run.id, text=script(*steps))
    wait_for(lambda: len(answers(run.id)) >= count and run_row(run.id).status == RunStatus.AWAITING_INPUT, 30)
    return answers(run.id)


def swept(predicate: Any) -> Any:
    """Run the sweep beat runs (answering waits past their deadline), then the predicate."""
    resident_sweep()
    return predicate()


def opened(run: Run) -> tuple[dict[str, Any], Run]:
    """Wait for the parent to park after its open; the open's answer and the child run."""
    wait_for(lambda: answers(run.id), timeout=30)
    wait_status(run.id, RunStatus.AWAITING_INPUT, RunStatus.COMPLETED, timeout=30)
    first = answers(run.id)[0]
    return first, run_row(first["child_run_id"])


def test_open_send_poll_cancel_close_drive_one_resident_child(stack: WorkerPool) -> None:
    run = parent(open_call(script({"text": "ready"}, {"text": "pong"})), {"text": "opened"})
    first, child = opened(run)
    assert first == {
        "child_run_id": child.id,
        "agent": CHILD,
        "state": "idle",
        "output": "ready",
        "is_error": False,
    }
    held = run_row(run.id)
    assert (child.status, child.interactive, child.parent_id, child.depth) == ("awaiting_input", True, run.id, 1)
    assert (child.lease_owner, child.reported_to_parent) == ("", True)  # parked, reported only as a resident
    assert "Agent" not in child.tools  # its own definition's tools, not its parent's
    assert (child.tenant_id, child.user_id, child.allowed_hosts) == (held.tenant_id, "u1", held.allowed_hosts)
    row = ResidentChild.objects.get(child_id=child.id)
    assert row.is_open and row.waiter_call_id == ""
    shown = agent_out(run_get(tenant_id=ALICE.read_tenant, run_id=child.id))  # GET /v1/agents/{id}'s body
    assert (shown["resident"], shown["resident_state"], shown["parent_agent_id"]) == (True, "idle", held.agent_id)
    assert agent_out(run_get(tenant_id=ALICE.read_tenant, run_id=run.id))["resident"] is False
    assert row.idle_ttl_seconds == settings.LOOMCYCLE.resident_child_idle_ttl_seconds

    # `ping` carries no script: the child plays the next step of its open prompt's script.
    send = agent(op="send", child_run_id=child.id, prompt="ping")
    reply = turn(run, send, {"text": "sent"}, count=2)[1]
    assert (reply["state"], reply["output"], reply["is_error"]) == ("idle", "pong", False)
    assert run_row(child.id).status == RunStatus.AWAITING_INPUT

    ops = [agent(op=op, child_run_id=child.id) for op in ("poll", "cancel", "close", "close")]
    poll, cancel, close, again = turn(run, *ops, {"text": "done"}, count=6)[2:]
    assert (poll["state"], poll["output"], poll["is_error"]) == ("idle", "", False)  # nothing new since the reply
    assert (cancel["state"], cancel["cancelled"]) == ("idle", False)  # an idle child has no turn to cancel
    assert (close["state"], close["reason"], close["closed"], close["is_error"]) == (
        "closed",
        "closed by parent",
        True,
        False,
    )
    assert (again["state"], again["reason"], again["is_error"]) == ("closed", "closed by parent", False)  # idempotent
    ended = wait_status(child.id, RunStatus.CANCELLED)
    assert ended.stop_reason == "resident child: closed by parent"
    assert not ResidentChild.objects.get(child_id=child.id).is_open
    assert_consecutive(run.id)
    assert_consecutive(child.id)


def test_a_send_past_its_timeout_answers_running_and_poll_reads_the_rest(stack: WorkerPool) -> None:
    child_script = script({"text": "ready"}, {"text": "late reply", "sleep_ms": 3000})
    run = parent(open_call(child_script), {"text": "opened"})
    _, child = opened(run)
    services.run_input(
        principal=ALICE,
        run_id=run.id,
        text=script(agent(op="send", child_run_id=child.id, prompt="go", timeout_ms=1), {"text": "waiting"}),
    )
    # The deadline is 1 ms after the park's commit: beat's sweep (or this one) answers the call.
    wait_for(lambda: swept(lambda: len(answers(run.id)) == 2), timeout=10)
    timed = answers(run.id)[1]
    assert (timed["state"], timed["timed_out"], timed["output"], timed["is_error"]) == ("running", True, "", False)
    wait_status(run.id, RunStatus.AWAITING_INPUT)
    wait_status(child.id, RunStatus.AWAITING_INPUT, timeout=30)  # the turn went on and ended
    poll = turn(run, agent(op="poll", child_run_id=child.id), {"text": "done"}, count=3)[2]
    assert (poll["state"], poll["output"]) == ("idle", "late reply")
    assert ResidentChild.objects.get(child_id=child.id).waiter_call_id == ""


def test_cancel_of_a_child_in_a_turn_cancels_the_turn_and_keeps_the_child(stack: WorkerPool) -> None:
    child_script = script({"text": "partial", "hold_ms": 60_000}, {"text": "second turn"})
    run = parent(open_call(child_script, timeout_ms=1), {"text": "opened"})
    wait_for(lambda: swept(lambda: answers(run.id)), timeout=10)
    first = answers(run.id)[0]
    assert (first["state"], first["timed_out"]) == ("running", True)
    wait_status(run.id, RunStatus.AWAITING_INPUT)
    child_id = first["child_run_id"]
    cancel = turn(run, agent(op="cancel", child_run_id=child_id), {"text": "done"}, count=2)[1]
    assert (cancel["cancelled"], cancel["is_error"]) == (True, False)
    # The child's turn is cut (turn_cancelled), it re-parks for input and stays open.
    wait_for(lambda: RunEvent.objects.filter(run_id=child_id, type="turn_cancelled").exists(), timeout=10)
    wait_status(child_id, RunStatus.AWAITING_INPUT, timeout=10)
    assert ResidentChild.objects.get(child_id=child_id).is_open
    # The cut turn's partial text, when the cut came after the mock streamed it, is kept and read
    # before the next turn's; a cut before it keeps nothing. Either way the child plays on.
    send = turn(run, agent(op="send", child_run_id=child_id, prompt="again"), {"text": "done"}, count=3)[2]
    assert send["state"] == "idle" and send["output"] in ("second turn", "partial\nsecond turn"), send
    assert_consecutive(child_id)


def test_an_idle_child_past_its_ttl_is_closed_by_the_sweep(stack: WorkerPool) -> None:
    run = parent(open_call(script({"text": "ready"}), idle_ttl_seconds=60), {"text": "opened"})
    _, child = opened(run)
    assert resident_sweep(now=timezone.now() + timedelta(seconds=30)) == 0  # within its TTL
    assert ResidentChild.objects.get(child_id=child.id).is_open
    assert resident_sweep(now=timezone.now() + timedelta(seconds=61)) == 1  # a clock past the TTL
    row = ResidentChild.objects.get(child_id=child.id)
    assert (row.is_open, row.close_reason) == (False, "idle ttl expired")
    assert wait_status(child.id, RunStatus.CANCELLED).stop_reason == "resident child: idle ttl expired"
    assert resident_sweep_task() == 0  # what beat runs: nothing left to do
    refused = turn(run, agent(op="send", child_run_id=child.id, prompt="hello?"), {"text": "done"}, count=2)[1]
    assert (refused["state"], refused["reason"], refused["is_error"]) == ("closed", "idle ttl expired", True)


def test_the_parents_end_closes_its_children(stack: WorkerPool) -> None:
    run = parent(open_call(script({"text": "ready"})), {"text": "bye"}, interactive=False)
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    (first,) = answers(run.id)
    assert first["state"] == "idle"
    ended = wait_status(first["child_run_id"], RunStatus.CANCELLED)
    assert ended.stop_reason == "resident child: parent run ended"
    assert ResidentChild.objects.get(child_id=ended.id).close_reason == "parent run ended"

    cancelled = parent(open_call(script({"text": "ready"})), {"text": "opened"})
    _, child = opened(cancelled)
    services.run_cancel(principal=ALICE, agent_id=cancelled.agent_id)
    wait_status(
        child.id, RunStatus.CANCELLED
    )  # by the cancel's cascade, or by the close of its row: whichever ran first
    assert wait_for(lambda: not ResidentChild.objects.get(child_id=child.id).is_open)


def test_a_parent_may_address_only_its_own_children(stack: WorkerPool) -> None:
    owner = parent(open_call(script({"text": "ready"})), {"text": "opened"})
    _, child = opened(owner)
    calls = [
        {"op": "send", "child_run_id": child.id, "prompt": "hi"},
        {"op": "poll", "child_run_id": child.id},
        {"op": "cancel", "child_run_id": child.id},
        {"op": "close", "child_run_id": child.id},
        {"op": "poll", "child_run_id": "r_0000000000000000"},
    ]
    other = parent({"tools": [{"tool": "Agent", "input": c} for c in calls]}, {"text": "done"}, interactive=False)
    wait_status(other.id, RunStatus.COMPLETED, timeout=30)
    got = answers(other.id)
    assert len(got) == len(calls) and all(a["is_error"] for a in got)
    assert all(a["error"].startswith("not a resident child of this run") for a in got)
    assert run_row(child.id).status == RunStatus.AWAITING_INPUT  # untouched
    assert ResidentChild.objects.get(child_id=child.id).is_open


def test_opens_past_the_cap_are_refused(stack: WorkerPool) -> None:
    cap = settings.LOOMCYCLE.resident_max_children
    opens = [{"tool": "Agent", "input": open_call(script({"text": f"c{i}"}))["input"]} for i in range(cap + 1)]
    run = parent({"tools": opens}, {"text": "done"})
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=60)
    got = answers(run.id)
    refused = [a for a in got if a["is_error"]]
    assert len(got) == cap + 1 and len(refused) == 1
    assert refused[0]["error"].startswith(f"resident child cap reached ({cap} open for this run)")
    assert ResidentChild.objects.filter(parent_id=run.id, is_open=True).count() == cap


def test_two_sends_to_one_child_in_one_step_refuse_the_second_and_answer_the_first(stack: WorkerPool) -> None:
    run = parent(open_call(script({"text": "ready"}, {"text": "pong"})), {"text": "opened"})
    _, child = opened(run)
    sends = [{"tool": "Agent", "input": {"op": "send", "child_run_id": child.id, "prompt": p}} for p in ("a", "b")]
    got = turn(run, {"tools": sends}, {"text": "done"}, count=3)[1:]  # the parent does not hang
    refused = [a for a in got if a["is_error"]]
    answered = [a for a in got if not a["is_error"]]
    assert len(refused) == 1 and refused[0]["error"].startswith("a call already waits on this child")
    assert (answered[0]["state"], answered[0]["output"]) == ("idle", "pong")
    assert ResidentChild.objects.get(child_id=child.id).waiter_call_id == ""


def test_the_sweep_stops_the_run_of_a_closed_row(no_workers: None) -> None:
    run = parent(open_call(script({"text": "ready"})), {"text": "opened"})
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.PARK
    row = ResidentChild.objects.get(parent_id=run.id)
    # A close whose stop of the child's run was lost (a crash between the two).
    ResidentChild.objects.filter(child_id=row.child_id).update(is_open=False, close_reason="closed by parent")
    assert run_row(row.child_id).status == RunStatus.QUEUED
    assert resident_sweep() >= 1
    assert run_row(row.child_id).stop_reason == "resident child: closed by parent"
    assert run_row(row.child_id).status == RunStatus.CANCELLED


def test_cancel_of_a_child_parked_on_its_own_wait_says_to_close_it(no_workers: None) -> None:
    asks = script({"tools": [{"tool": "Interruption", "input": ASK}]}, {"text": "done"})
    run = parent(agent(op="open", name="asker", prompt=asks, timeout_ms=1), {"text": "opened"})
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.PARK
    child = Run.objects.get(parent_id=run.id)
    engine.run_iterate(run_id=child.id, step=0)
    assert run_row(child.id).status == RunStatus.AWAITING_INTERRUPT  # its turn waits on its own question
    resident_sweep()  # the open's 1 ms wait is over: answered `running`, timed out
    engine.run_iterate(run_id=run.id, step=run_row(run.id).step)
    services.run_input(principal=ALICE, run_id=run.id, text=script(agent(op="cancel", child_run_id=child.id)))
    engine.run_iterate(run_id=run.id, step=run_row(run.id).step)
    cancel = answers(run.id)[1]
    assert (cancel["state"], cancel["cancelled"], cancel["is_error"]) == ("running", False, False)
    assert "use close" in cancel["note"]
    assert run_row(child.id).status == RunStatus.AWAITING_INTERRUPT  # untouched
