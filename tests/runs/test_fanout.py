"""Fan-out with one join (issue 22, part 3): the Agent tool's op
parallel_spawn and POST /v1/runs:batch. Real workers, beat and a web process;
every agent plays mock-script (tests/loomcycle.test.yaml: fanner, fanner-wide,
fan-child), each prompt carrying its script. The 1,000-child fan-out is
bench/fanout.py's (`make bench-fanout`); the suite runs 100 children from 10
parents, the same path at a tenth of the size."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from apps.runs import engine, services
from apps.runs.children import batch, fanout, report
from apps.runs.children.report import run_child_finished
from apps.runs.fanout_models import FanOut, FanOutSlot
from apps.runs.models import TERMINAL, Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def script(steps: list[dict[str, Any]]) -> str:
    return f"MOCK_SCRIPT: {json.dumps(steps)}"


def child(text: str, **step: Any) -> dict[str, Any]:
    """A fan-child entry answering `text` (after `step`'s sleep_ms / error)."""
    return {"name": "fan-child", "prompt": script([{"text": text, **step}])}


def fan(spawns: list[dict[str, Any]], agent: str = "fanner-wide") -> Run:
    """A parent whose first turn is one parallel_spawn call, then "done"."""
    steps = [{"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": spawns}}, {"text": "done"}]
    data = services.RunCreate(agent=agent, segments=[Segment(text=script(steps))], user_id="alice")
    return services.run_create(principal=ALICE, data=data)


def envelope(run_id: str) -> list[dict[str, Any]]:
    """The parent's one Agent tool_result, parsed."""
    [result] = [e.payload for e in RunEvent.objects.filter(run_id=run_id, type="tool_result")]
    assert result["is_error"] is False
    results: list[dict[str, Any]] = json.loads(str(result["text"]))["results"]
    return results


def test_parallel_spawn_answers_once_with_every_result_index_aligned(stack: WorkerPool) -> None:
    spawns = [child("r0"), child("r1", sleep_ms=200), child("boom", error=500), child("r3")]
    spawns[0]["parent_context"] = {"function_key": "k0"}
    spawns.append({"name": "no-such-agent", "prompt": "hi", "parent_context": {"function_key": "k4"}})
    parent = fan(spawns)
    done = wait_status(parent.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=40)
    assert (done.status, done.pending_calls) == (RunStatus.COMPLETED, 0)
    results = envelope(parent.id)
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    assert [(r["ok"], r.get("output")) for r in results[:2]] == [(True, "r0"), (True, "r1")]
    assert results[0]["parent_context"] == {"function_key": "k0"} and "parent_context" not in results[1]
    assert results[2]["ok"] is False and results[2]["error"].startswith("failed:")
    assert (results[3]["ok"], results[3]["output"]) == (True, "r3")
    refused = results[4]
    assert refused["ok"] is False and "unknown agent" in refused["error"]
    assert refused["parent_context"] == {"function_key": "k4"} and "run_id" not in refused
    kids = {r.id: r for r in Run.objects.filter(parent_id=parent.id)}
    assert sorted(r["run_id"] for r in results[:4]) == sorted(kids)  # the refused entry made no child
    assert all(k.reported_to_parent and k.depth == 1 for k in kids.values())
    join = FanOut.objects.get(parent_run_id=parent.id)
    assert (join.size, join.reported, join.completed_at is not None) == (5, 5, True)
    assert run_child_finished(child_id=results[0]["run_id"]) is False  # reported exactly once


def test_children_beyond_max_concurrent_children_wait_as_rows(stack: WorkerPool) -> None:
    parent = fan([child(f"c{i}", sleep_ms=400) for i in range(5)], agent="fanner")  # max_concurrent_children: 2
    waiting = wait_for(lambda: Run.objects.filter(parent_id=parent.id, status=RunStatus.WAITING_FANOUT).count() == 3)
    assert waiting
    parked = run_row(parent.id)
    assert (parked.status, parked.lease_owner, parked.pending_calls) == (RunStatus.WAITING_CHILDREN, "", 1)
    wait_status(parent.id, RunStatus.COMPLETED, timeout=40)
    assert [r["output"] for r in envelope(parent.id)] == [f"c{i}" for i in range(5)]
    spans = [(k.started_at, k.completed_at) for k in Run.objects.filter(parent_id=parent.id)]
    assert all(s is not None and e is not None for s, e in spans)
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end sorts before a start
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == 2  # never more than the agent's max_concurrent_children, and the slots were used


def test_cancel_of_a_three_level_tree_lands_within_a_second(stack: WorkerPool) -> None:
    leaf = child("late", sleep_ms=60_000)
    middle = script([{"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": [leaf, leaf]}}])
    root = fan([{"name": "fanner-wide", "prompt": middle}, {"name": "fanner-wide", "prompt": middle}])
    wait_for(lambda: Run.objects.filter(depth=2, status=RunStatus.RUNNING).count() == 4, timeout=30)
    t0 = time.monotonic()
    services.run_cancel(principal=ALICE, agent_id=root.agent_id)
    tree = Run.objects.filter(id=root.id) | Run.objects.filter(depth__in=[1, 2])
    wait_for(lambda: all(r.status == RunStatus.CANCELLED for r in tree.all()), timeout=5, interval=0.01)
    assert time.monotonic() - t0 < 1.0
    assert tree.count() == 7


def test_a_fanout_of_100_children_from_10_parents_gets_every_result(stack: WorkerPool) -> None:
    parents = [fan([child(f"p{p}c{c}") for c in range(10)]) for p in range(10)]
    wait_for(lambda: Run.objects.filter(depth=1).count() == 100, timeout=30)
    parked = Run.objects.filter(id__in=[p.id for p in parents], status=RunStatus.WAITING_CHILDREN)
    assert all(p.lease_owner == "" for p in parked)  # a waiting parent holds no worker
    for p in parents:
        wait_status(p.id, RunStatus.COMPLETED, timeout=90)
    for n, p in enumerate(parents):
        assert [(r["ok"], r["output"]) for r in envelope(p.id)] == [(True, f"p{n}c{c}") for c in range(10)]
    assert FanOutSlot.objects.exclude(state="reported").count() == 0


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        ({"spawns": [{"name": "fan-child", "prompt": "hi"}] * 33}, "1..32 entries"),
        ({"spawns": []}, "1..32 entries"),
        ({"name": "fan-child", "prompt": "hi", "spawns": [{"name": "fan-child", "prompt": "hi"}]}, "top-level"),
        ({"spawns": [{"name": "fan-child", "prompt": "hi", "tools": ["Agent"]}]}, "spawns[0] must be an object"),
        ({"spawns": [{"name": "bad name", "prompt": "hi"}]}, "spawns[0].name"),
        ({"spawns": [{"name": "fan-child", "prompt": " "}]}, "spawns[0].prompt"),
        ({"spawns": [{"name": "fan-child", "prompt": "hi", "parent_context": "x"}]}, "parent_context must be"),
    ],
)
def test_parallel_spawn_input_that_does_not_fit_is_refused_whole(data: dict[str, Any], refusal: str) -> None:
    with pytest.raises(fanout.EntryRefused, match=re.escape(refusal)):
        fanout.parse_entries(data)


# --- POST /v1/runs:batch


def batch_spawn(text: str, agent: str = "fan-child", **step: Any) -> dict[str, Any]:
    return {"agent": agent, "prompt": script([{"text": text, **step}])}


def test_batch_joins_every_run_index_aligned(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    spawns = [batch_spawn("a", sleep_ms=300), batch_spawn("b"), batch_spawn("x", error=500)]
    spawns[1]["parent_context"] = {"function_key": "fk"}
    spawns.append({"agent": "no-such-agent", "prompt": "hi"})
    reply = http.post("/v1/runs:batch", json={"spawns": spawns, "mode": "join"}, headers=people["bob"], timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["spawned"] == 3 and "timed_out" not in body
    a, b, x, ghost = body["results"]
    assert (a["status"], a["final_text"], a["error"]) == ("completed", "a", "")
    assert (b["final_text"], b["parent_context"]) == ("b", {"function_key": "fk"})
    assert x["status"] == "failed" and x["error"].startswith("failed:")
    assert (ghost["run_id"], ghost["status"]) == ("", "failed") and "unknown_agent" in ghost["error"]
    runs = Run.objects.filter(id__in=[a["run_id"], b["run_id"], x["run_id"]])
    assert {(r.tenant_id, r.parent_id, r.reported_to_parent) for r in runs} == {("acme", None, True)}


def test_batch_over_32_spawns_or_another_mode_is_400(
    stack: WorkerPool, http: httpx.Client, people: dict[str, Any]
) -> None:
    many = {"spawns": [batch_spawn("n")] * 33}
    reply = http.post("/v1/runs:batch", json=many, headers=people["bob"])
    assert (reply.status_code, reply.json()["code"]) == (400, "invalid_spawns")
    reply = http.post("/v1/runs:batch", json={"spawns": []}, headers=people["bob"])
    assert (reply.status_code, reply.json()["code"]) == (400, "invalid_spawns")
    reply = http.post("/v1/runs:batch", json={"spawns": [batch_spawn("n")], "mode": "stream"}, headers=people["bob"])
    assert (reply.status_code, reply.json()["code"]) == (400, "unsupported_mode")
    detach_with_timeout = {"spawns": [batch_spawn("n")], "mode": "detach", "timeout_ms": 1000}
    reply = http.post("/v1/runs:batch", json=detach_with_timeout, headers=people["bob"])
    assert (reply.status_code, reply.json()["code"]) == (400, "invalid_body") and "detach" in reply.json()["error"]
    assert not Run.objects.exists()
    ghosts = {"spawns": [{"agent": "no-such-agent", "prompt": "hi"}]}  # nothing started: answered at once
    reply = http.post("/v1/runs:batch", json=ghosts, headers=people["bob"], timeout=10)
    assert (reply.status_code, reply.json()["spawned"], reply.json()["results"][0]["status"]) == (200, 0, "failed")


def test_a_detached_batch_answers_handles_at_once_and_its_runs_go_on(
    stack: WorkerPool, http: httpx.Client, people: dict[str, Any]
) -> None:
    slow = {**batch_spawn("slow", sleep_ms=3000), "parent_context": {"function_key": "fk"}}
    spawns = [slow, batch_spawn("quick"), {"agent": "no-such-agent", "prompt": "hi"}]
    started = time.monotonic()
    reply = http.post("/v1/runs:batch", json={"spawns": spawns, "mode": "detach"}, headers=people["bob"], timeout=30)
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - started < 3.0  # it did not wait for the slow child
    body = reply.json()
    first, second, ghost = body["results"]
    assert body["spawned"] == 2 and "timed_out" not in body
    assert (first["status"], first["final_text"], first["error"]) == ("running", "", "")
    assert first["parent_context"] == {"function_key": "fk"} and second["status"] == "running"
    assert run_row(first["run_id"]).parent_context == {"function_key": "fk"}  # stored on the run too
    assert (ghost["run_id"], ghost["status"]) == ("", "failed") and "unknown_agent" in ghost["error"]
    assert wait_status(first["run_id"], *TERMINAL, timeout=30).status == RunStatus.COMPLETED
    assert wait_status(second["run_id"], *TERMINAL).status == RunStatus.COMPLETED
    assert not FanOut.objects.exists()  # no join: nothing waits on a detached batch
    assert http.get(f"/v1/agents/{first['agent_id']}", headers=people["bob"]).json()["status"] == "completed"


def test_batch_runs_are_the_callers_tenants(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    spawn = {**batch_spawn("mine"), "tenant_id": "acme"}  # the token's tenant wins over the body's claim
    reply = http.post("/v1/runs:batch", json={"spawns": [spawn]}, headers=people["charlie"], timeout=60)
    [result] = reply.json()["results"]
    assert (run_row(result["run_id"]).tenant_id, result["final_text"]) == ("beta", "mine")
    assert http.get(f"/v1/agents/{result['agent_id']}", headers=people["bob"]).status_code == 404
    assert http.get(f"/v1/agents/{result['agent_id']}", headers=people["charlie"]).status_code == 200


def test_batch_timeout_cancels_what_still_runs(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    spawns = [batch_spawn("quick"), batch_spawn("late", sleep_ms=60_000)]
    reply = http.post("/v1/runs:batch", json={"spawns": spawns, "timeout_ms": 1500}, headers=people["bob"])
    body = reply.json()
    assert (reply.status_code, body["timed_out"]) == (200, True)
    quick, late = body["results"]
    assert (quick["status"], quick["final_text"]) == ("completed", "quick")
    assert late["error"] == "runs:batch timed out; run cancelled"
    assert wait_status(late["run_id"], *TERMINAL).status == RunStatus.CANCELLED


# --- In this process (no workers): the join's steps one by one.


def test_a_report_starts_the_next_waiting_sibling_in_its_own_transaction(no_workers: None) -> None:
    parent = fan([child("c0"), child("c1"), child("c2")], agent="fanner")  # max_concurrent_children: 2
    assert engine.run_iterate(run_id=parent.id, step=0) == engine.Outcome.PARK
    ids = FanOutSlot.objects.filter(fanout__parent_run_id=parent.id).order_by("index").values_list("run_id", flat=True)
    kids = [run_row(str(i)) for i in ids]
    assert [k.status for k in kids] == [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.WAITING_FANOUT]
    assert engine.run_iterate(run_id=kids[2].id, step=0) == engine.Outcome.NOOP  # a waiting child is not claimed
    engine.run_iterate(run_id=kids[0].id, step=0)  # completes, reports, and starts kids[2]
    assert (run_row(kids[2].id).status, run_row(parent.id).pending_calls) == (RunStatus.QUEUED, 1)
    engine.run_iterate(run_id=kids[2].id, step=0)
    assert run_row(parent.id).status == RunStatus.WAITING_CHILDREN  # one child still runs
    engine.run_iterate(run_id=kids[1].id, step=0)  # the last report answers the parent's one call
    assert (run_row(parent.id).status, run_row(parent.id).pending_calls) == (RunStatus.RUNNING, 0)
    engine.run_iterate(run_id=parent.id, step=1)
    assert run_row(parent.id).status == RunStatus.COMPLETED
    assert [r["output"] for r in envelope(parent.id)] == ["c0", "c1", "c2"]


def test_a_lost_batch_report_is_made_once_by_the_sweep(no_workers: None) -> None:
    spawns = [batch.BatchSpawn(services.RunCreate(agent="fan-child", segments=[Segment(text="hi")])) for _ in "ab"]
    join_id = batch.batch_start(principal=ALICE, spawns=spawns)
    kids = [s.run_id for s in FanOutSlot.objects.filter(fanout_id=join_id).order_by("index")]
    past = timezone.now() - timedelta(seconds=10)
    # A worker that committed both children's ends and died before reporting them.
    Run.objects.filter(id__in=kids).update(status=RunStatus.COMPLETED, completed_at=past)
    assert FanOut.objects.get(id=join_id).completed_at is None
    assert report.children_report_sweep() == 2
    assert report.children_report_sweep() == 0  # reported exactly once
    join = FanOut.objects.get(id=join_id)
    assert (join.reported, join.completed_at is not None) == (2, True)
    body = batch.batch_result(fanout_id=join_id)
    assert [(r["run_id"], r["status"]) for r in body["results"]] == [(k, "completed") for k in kids]


def test_spawned_children_of_an_interactive_definition_end_and_report(no_workers: None) -> None:
    # `compactor`'s definition says interactive: true; a spawn / parallel_spawn child must end all the same.
    kid = {"name": "compactor", "prompt": script([{"text": "one-shot"}])}
    steps = [
        {"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": [kid]}},
        {"tool": "Agent", "input": {"op": "spawn", **kid}},
        {"text": "done"},
    ]
    data = services.RunCreate(agent="fanner-wide", segments=[Segment(text=script(steps))], user_id="alice")
    parent = services.run_create(principal=ALICE, data=data)
    for step in (0, 1):  # each step parks on one child; the child's end wakes the parent
        assert engine.run_iterate(run_id=parent.id, step=step) == engine.Outcome.PARK
        [kid_run] = Run.objects.filter(parent_id=parent.id, status=RunStatus.QUEUED)
        assert kid_run.interactive is False
        engine.run_iterate(run_id=kid_run.id, step=0)
        assert run_row(kid_run.id).status == RunStatus.COMPLETED
    engine.run_iterate(run_id=parent.id, step=2)
    assert run_row(parent.id).status == RunStatus.COMPLETED
    texts = [e.payload["text"] for e in RunEvent.objects.filter(run_id=parent.id, type="tool_result").order_by("seq")]
    assert "one-shot" in texts[0] and texts[1].endswith("one-shot")


def test_batch_refuses_an_interactive_run(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    body = {"spawns": [{**batch_spawn("n"), "interactive": True}]}
    reply = http.post("/v1/runs:batch", json=body, headers=people["bob"])
    assert (reply.status_code, reply.json()["code"]) == (422, "interactive_not_allowed")
    reply = http.post(
        "/v1/runs:batch", json={"spawns": [batch_spawn("by-def", agent="compactor")]}, headers=people["bob"], timeout=60
    )
    [result] = reply.json()["results"]  # its definition says interactive: it is run to its end all the same
    assert (result["status"], result["final_text"]) == ("completed", "by-def")


def test_cancelling_a_waiting_child_starts_no_sibling(no_workers: None) -> None:
    parent = fan([child(f"c{i}") for i in range(4)], agent="fanner")  # max_concurrent_children: 2
    assert engine.run_iterate(run_id=parent.id, step=0) == engine.Outcome.PARK
    ids = FanOutSlot.objects.filter(fanout__parent_run_id=parent.id).order_by("index").values_list("run_id", flat=True)
    kids = [run_row(str(i)) for i in ids]
    services.run_cancel(principal=ALICE, agent_id=kids[2].agent_id)  # a waiting child: it held no place
    assert run_row(kids[2].id).status == RunStatus.CANCELLED
    assert [run_row(k.id).status for k in kids] == [
        RunStatus.QUEUED,
        RunStatus.QUEUED,
        RunStatus.CANCELLED,
        RunStatus.WAITING_FANOUT,  # still two at a time
    ]
    engine.run_iterate(run_id=kids[0].id, step=0)  # a started child's end frees a place: kids[3] takes it
    assert run_row(kids[3].id).status == RunStatus.QUEUED


def test_the_lease_sweep_cancels_live_children_of_an_ended_parent(no_workers: None) -> None:
    parent = fan([child(f"c{i}") for i in range(3)], agent="fanner")  # two queued, one waiting_fanout
    assert engine.run_iterate(run_id=parent.id, step=0) == engine.Outcome.PARK
    # A cancel whose cascade was lost (a crash after the parent's own cancel committed).
    Run.objects.filter(id=parent.id).update(status=RunStatus.CANCELLED)
    assert services.run_orphans_cancel() == 3
    kids = Run.objects.filter(parent_id=parent.id)
    assert {(k.status, k.stop_reason) for k in kids} == {(RunStatus.CANCELLED, "parent run ended")}
    assert services.run_orphans_cancel() == 0  # nothing left: one set of effects
