"""Context compaction (issue 22, part 5; docs/compaction.md): manual, automatic and
self compaction through real workers and a web process, the clean-cut rule, replay
on restarted workers, settings down the spawn tree, and the route's refusals.
The agents play mock-script (tests/loomcycle.test.yaml: compactor*, compactor-child)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.channels import services as channels
from apps.channels.streams import Stream
from apps.core.types import Principal
from apps.runs import services
from apps.runs.compacted import MARKER_ROLE, SUMMARY_HEADER, Entry, choose_cut, turn_starts, visible
from apps.runs.create import compaction_routing
from apps.runs.models import Run, RunEvent, RunInput, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment, messages_from_rows
from apps.substrate.kinds import Refused, normalise_agent
from apps.substrate.models import ChannelDef
from tests.conftest import ALICE, wait_for, wait_status
from tests.procs import WorkerPool

Row = tuple[str, list[dict[str, Any]]]


def script(text: str, steps: list[dict[str, Any]]) -> str:
    return f"{text} MOCK_SCRIPT: {json.dumps(steps)}"


def start(agent: str, prompt: str, principal: Principal = ALICE) -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)])
    return services.run_create(principal=principal, data=data)


def events(run_id: str, *types: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    return [{"type": e.type, **e.payload} for e in rows if not types or e.type in types]


def parked(run_id: str, turns: int, timeout: float = 30) -> None:
    """Wait until the run has parked at awaiting_input `turns` times and is parked now."""
    wait_for(lambda: len(events(run_id, "awaiting_input")) >= turns, timeout=timeout)
    wait_status(run_id, RunStatus.AWAITING_INPUT, timeout=timeout)


def turn(run: Run, prompt: str, turns: int, timeout: float = 30) -> None:
    services.run_input(principal=ALICE, run_id=run.id, text=prompt)
    parked(run.id, turns, timeout)


def echoed(run_id: str) -> list[dict[str, str]]:
    """The messages the model was sent, as the last `echo` step reported them."""
    return list(json.loads(events(run_id, "text")[-1]["text"])["messages"])


def rows_of(run_id: str) -> list[Row]:
    return [(r.role, r.content) for r in TranscriptEntry.objects.filter(run_id=run_id).order_by("idx")]


def compactions(run_id: str) -> list[dict[str, Any]]:
    return [e["context_compaction"] for e in events(run_id, "context_compaction")]


@pytest.mark.usefixtures("agents")
def test_manual_compaction_keeps_the_last_turn_and_replays_on_new_workers(
    stack: WorkerPool, http: httpx.Client
) -> None:
    long_one = "Turn one: the word is apple. " + "Some detail that a summary drops. " * 20
    run = start("compactor", script(long_one, [{"text": "noted apple"}]))
    parked(run.id, 1)
    two = script("Turn two.", [{"tool": "Context", "input": {"op": "time"}}, {"text": "it is late"}])
    turn(run, two, 2)
    before = rows_of(run.id)

    resp = http.post(f"/v1/runs/{run.id}/compact")
    assert resp.status_code == 202 and resp.json()["queued"] is True
    parked(run.id, 3)  # woken, compacted, parked again without a model turn
    (done,) = compactions(run.id)
    assert done["trigger"] == "manual" and done["keep_n"] == 1
    assert done["summary"].startswith("[mock summary]") and done["after_tokens"] < done["before_tokens"]
    after = rows_of(run.id)
    assert after[: len(before)] == before  # append-only: nothing rewritten
    assert [role for role, _ in after[len(before) :]] == [MARKER_ROLE]
    assert after[-1][1][0]["kept_rows"] == 4  # turn two whole: its text, tool_use, tool_result, answer

    for pid in stack.pids():  # the compacted history lives in rows, not in a worker
        stack.kill(pid)
    stack.ensure()
    turn(run, script("Turn three.", [{"echo": True}]), 4, timeout=90)  # new processes start on a busy host
    seen = echoed(run.id)
    assert [m["role"] for m in seen] == ["user", "assistant", "user", "assistant", "user"]
    assert seen[0]["text"] == f"{SUMMARY_HEADER}{done['summary']}\n{two}"  # summary + the kept turn, verbatim
    assert [m["text"] for m in seen[1:]] == ["", "", "it is late", script("Turn three.", [{"echo": True}])]
    assert "apple" not in json.dumps(seen)  # turn one reached the model only through its summary
    replayed = messages_from_rows(rows_of(run.id)[:-1])  # the rows as they stood before the echo's answer
    assert [m["role"] for m in replayed] == [m["role"] for m in seen]


@pytest.mark.usefixtures("agents")
def test_automatic_compaction_past_the_threshold_chains_summaries(stack: WorkerPool) -> None:
    run = start("compactor-auto", script("Turn one.", [{"text": "one"}]))
    parked(run.id, 1)
    turn(run, script("Turn two.", [{"text": "two"}]), 2)
    assert compactions(run.id) == []  # well under 10% of the 8192-token window
    padding = "lorem ipsum " * 500  # ~1500 tokens: past the threshold from here on
    turn(run, script(f"Turn three. {padding}", [{"text": "three"}]), 3)
    (first,) = compactions(run.id)  # before turn three's call: turns one and two summarised
    assert first["trigger"] == "auto" and first["before_tokens"] * 100 > 8192 * 10
    four = script("Turn four.", [{"echo": True}])
    turn(run, four, 4)  # turn three's padding is still kept: over again, so summary 1 + turn three go
    first, second = compactions(run.id)
    assert second["trigger"] == "auto" and second["summary"] != first["summary"]
    assert echoed(run.id) == [{"role": "user", "text": f"{SUMMARY_HEADER}{second['summary']}\n{four}"}]


@pytest.mark.usefixtures("agents")
def test_the_context_compact_op_applies_before_the_next_model_call(stack: WorkerPool) -> None:
    run = start("compactor", script("Turn one.", [{"text": "one"}]))
    parked(run.id, 1)
    two = script("Turn two.", [{"tool": "Context", "input": {"op": "compact"}}, {"echo": True}])
    turn(run, two, 2)
    (result,) = events(run.id, "tool_result")
    assert not result["is_error"] and json.loads(result["text"])["requested"] is True
    (done,) = compactions(run.id)
    assert done["trigger"] == "self"
    seen = echoed(run.id)  # turn one summarised; the turn in progress kept whole
    assert [m["role"] for m in seen] == ["user", "assistant", "user"]
    assert seen[0]["text"] == f"{SUMMARY_HEADER}{done['summary']}\n{two}"


@pytest.mark.usefixtures("agents")
def test_a_request_to_a_parked_run_waits_for_its_wake_and_asking_twice_is_one(
    stack: WorkerPool, http: httpx.Client
) -> None:
    subscribe = {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000, "max_messages": 1}
    run = start("scripted", script("Wait for the handoff.", [{"tool": "Channel", "input": subscribe}, {"text": "ok"}]))
    wait_status(run.id, RunStatus.WAITING_CHANNEL, timeout=30)
    first, second = (http.post(f"/v1/runs/{run.id}/compact", json={"keep_last_n": 1}) for _ in range(2))
    assert (first.status_code, first.json()["duplicate"]) == (202, False)
    assert (second.status_code, second.json()["duplicate"]) == (202, True)
    assert RunInput.objects.filter(run_id=run.id, source="compact").count() == 1
    assert Run.objects.get(id=run.id).status == RunStatus.WAITING_CHANNEL  # not woken: it applies at the wake
    declared = ChannelDef.objects.get(name="handoff", tenant_id="")
    channels.publish(stream=Stream("", "handoff", "global", ""), declared=declared, value="go", published_by="_test")
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    (skipped,) = events(run.id, "context_compaction_skipped")  # one turn only: nothing earlier to summarise
    assert skipped["trigger"] == "manual"
    assert compactions(run.id) == []


@pytest.mark.usefixtures("agents")
def test_refusals_404_409_422_and_400(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    acme = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
    run = start("compactor", script("Hello.", [{"text": "hi"}]), principal=acme)
    parked(run.id, 1)
    foreign = http.post(f"/v1/runs/{run.id}/compact", headers=people["charlie"])
    assert (foreign.status_code, foreign.json()["code"]) == (404, "not_found")
    unknown = http.post("/v1/runs/r_0000000000000000/compact", headers=people["alice"])
    assert unknown.status_code == 404
    bad = http.post(f"/v1/runs/{run.id}/compact", json={"keep_last_n": 0}, headers=people["alice"])
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_body")
    assert not RunInput.objects.filter(run_id=run.id).exists()

    off = start("compactor-off", script("Hello.", [{"text": "hi"}]), principal=acme)
    parked(off.id, 1)
    disabled = http.post(f"/v1/runs/{off.id}/compact", headers=people["alice"])
    assert (disabled.status_code, disabled.json()["code"]) == (422, "compaction_disabled")

    services.run_cancel(principal=acme, run_id=run.id, reason="done")
    wait_status(run.id, RunStatus.CANCELLED, timeout=10)
    ended = http.post(f"/v1/runs/{run.id}/compact", headers=people["alice"])
    assert (ended.status_code, ended.json()["code"]) == (409, "run_terminal")


@pytest.mark.usefixtures("agents")
def test_a_child_inherits_its_parents_settings_unless_its_own_def_sets_them(stack: WorkerPool) -> None:
    spawn = {"op": "spawn", "name": "compactor-child", "prompt": script("Child.", [{"text": "child done"}])}
    run = start("compactor", script("Spawn.", [{"tool": "Agent", "input": spawn}, {"text": "parent done"}]))
    parked(run.id, 1)
    child = Run.objects.get(parent_id=run.id)
    assert child.routing["compaction"] == {"keep_last_n": 1}
    own = {"compaction": {"autocompact_at_pct": 50, "keep_first": None}}
    assert compaction_routing(own, run.id) == {"compaction": {"autocompact_at_pct": 50}}
    assert compaction_routing({}, None) == {}


# --- the cut, on transcripts the engine would not write ------------------------------------


def _use(*ids: str) -> Row:
    return ("assistant", [{"type": "tool_use", "id": i, "name": "T", "input": {}} for i in ids])


def _result(i: str) -> Row:
    return ("user", [{"type": "tool_result", "tool_use_id": i, "content": "r", "is_error": False}])


def _text(role: str, text: str) -> Row:
    return (role, [{"type": "text", "text": text}])


def _paired(kept: list[Entry]) -> bool:
    """Every tool_use in `kept` has its result there, and every result its tool_use."""
    uses = {b["id"] for e in kept for b in e.content if b["type"] == "tool_use"}
    results = {b["tool_use_id"] for e in kept for b in e.content if b["type"] == "tool_result"}
    return uses == results


def test_a_cut_never_separates_a_tool_use_from_its_result() -> None:
    rows = [
        _text("user", "one"),
        _use("a"),
        _text("user", "a steer that landed before the result"),  # the naive turn start: it would split `a`
        _result("a"),
        _text("assistant", "answered"),
        _text("user", "two"),
        _use("b", "c"),
        _result("b"),
        _result("c"),
        _text("assistant", "done"),
    ]
    view = visible(rows)
    assert turn_starts(view) == [0, 5]  # not 2: `a` was still waiting for its result
    for keep_n in (1, 2, 3):
        cut = choose_cut(view, keep_n=keep_n, keep_first=False)
        assert cut is not None and cut.at == 5 and _paired(cut.kept) and _paired(cut.summarised)
    assert choose_cut(visible(rows[:5]), keep_n=1, keep_first=False) is None  # one turn: nothing to summarise
    turns = visible([_text(role, str(n)) for n in range(3) for role in ("user", "assistant")])
    two = choose_cut(turns, keep_n=2, keep_first=False)
    assert two is not None and two.at == 2
    small = choose_cut(turns, keep_n=2, keep_first=False, fits=lambda kept: len(kept) <= 2)  # target_percentage
    assert small is not None and small.at == 4  # fewer turns kept, down to one


def test_an_invalid_compaction_block_is_refused() -> None:
    base = {"provider": "mock", "model": "mock-script"}
    assert normalise_agent("ok", {**base, "compaction": {"keep_last_n": 3, "autocompact_at_pct": 80}}, True)
    for block, says in (
        ({"keep_last_n": "two"}, "keep_last_n"),
        ({"autocompact_at_pct": 101}, "autocompact_at_pct"),
        ({"enabled": "yes"}, "enabled"),
        ({"shrink": True}, "unknown field"),
    ):
        with pytest.raises(Refused, match=says):
            normalise_agent("bad", {**base, "compaction": block}, True)


def test_the_latest_marker_rebuilds_the_history_and_keep_first_keeps_the_prompt() -> None:
    prompt, one, two = _text("user", "the task"), _text("assistant", "a1"), _text("user", "u2")
    marker = (MARKER_ROLE, [{"type": "compaction", "summary": "S1", "kept_rows": 2, "keep_first": True}])
    rows = [prompt, one, two, _text("assistant", "a2"), marker, _text("user", "u3")]
    view = visible(rows)
    assert [(e.idx, e.content[0]["text"]) for e in view] == [
        (0, "the task"),
        (None, SUMMARY_HEADER + "S1"),
        (2, "u2"),
        (3, "a2"),
        (5, "u3"),
    ]
    cut = choose_cut(view, keep_n=1, keep_first=True)  # the prompt stays ahead; summary 1 and turn u2 go
    assert cut is not None and (cut.lead, cut.at) == (1, 4)
    later = (MARKER_ROLE, [{"type": "compaction", "summary": "S2", "kept_rows": 1, "keep_first": False}])
    assert messages_from_rows([*rows, later]) == [
        {"role": "user", "content": [{"type": "text", "text": SUMMARY_HEADER + "S2"}, *rows[5][1]]}
    ]
