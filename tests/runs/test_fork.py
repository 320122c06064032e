"""Fork from a step (`POST /v1/runs/{id}/fork`, issue 22, beyond loomcycle): a new run
in a new session whose history is the source's transcript through iteration N. It
reproduces steps 0..N, diverges after (mock-script `echo` shows the model got exactly
the forked history), records its lineage, and refuses a cut it cannot make. Real
workers and a web process; the agents play mock-script (tests/loomcycle.test.yaml)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from apps.core.errors import NotFound
from apps.core.types import Principal
from apps.runs import backpressure, services
from apps.runs.fork import ForkRequest, run_fork
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
PARK = {"op": "subscribe", "channel": "handoff", "wait_ms": 120_000, "max_messages": 1}
SOURCE_SCRIPT = [
    {"text": "looking", "tool": "Context", "input": {"op": "time"}},
    {"tool": "Context", "input": {"op": "self"}},
    {"text": "original end"},
]


def scripted(steps: list[dict[str, Any]], agent: str = "scripted", **kw: Any) -> Run:
    prompt = f"Test prompt. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ACME, data=data)


def rows(run_id: str, *, max_step: int | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    qs = TranscriptEntry.objects.filter(run_id=run_id).order_by("idx")
    if max_step is not None:
        qs = qs.filter(step__lte=max_step)
    return [(r.role, r.content) for r in qs]


def shape(transcript: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, list[Any]]]:
    """A transcript without what differs between runs by design: tool ids (derived from the
    run id) and the output of Context (the time, the run's own ids)."""

    def block(b: dict[str, Any]) -> Any:
        if b["type"] == "tool_use":
            return ("tool_use", b["name"], b["input"])
        if b["type"] == "tool_result":
            return ("tool_result", b["is_error"])
        return (b["type"], b.get("text"))

    return [(role, [block(b) for b in content]) for role, content in transcript]


def events(run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type=kind).order_by("seq")]


def fork(http: httpx.Client, run_id: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    return http.post(f"/v1/runs/{run_id}/fork", json=body, headers=headers)


@pytest.fixture
def source(stack: WorkerPool) -> Run:
    """A finished acme run of three steps: a tool call with text, another tool call, an answer."""
    run = scripted(SOURCE_SCRIPT)
    return wait_status(run.id, RunStatus.COMPLETED, timeout=30)


def test_a_fork_reproduces_steps_0_to_n_and_the_model_sees_exactly_that_history(
    source: Run, http: httpx.Client, people: dict[str, Any], admin_client: Client
) -> None:
    prompt = 'Forked here. MOCK_SCRIPT: [{"echo": true}]'
    made = fork(http, source.id, people["bob"], from_step=0, prompt=prompt)
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["forked_from_run"], body["forked_at_step"], body["status"]) == (source.id, 0, "queued")
    assert body["session_id"] != source.session_id
    done = wait_status(body["run_id"], RunStatus.COMPLETED, timeout=30)

    kept = rows(source.id, max_step=0)
    assert [r for r, _ in kept] == ["user", "assistant", "user"]  # the prompt, text + tool_use, its result
    assert rows(done.id)[: len(kept)] == kept  # steps 0..0 as they were, row for row
    seen = json.loads(events(done.id, "text")[-1]["text"])
    assert seen["messages"] == [
        {"role": "user", "text": f"Test prompt. MOCK_SCRIPT: {json.dumps(SOURCE_SCRIPT)}"},
        {"role": "assistant", "text": "looking"},
        {"role": "user", "text": prompt},  # beside step 0's tool result: nothing of steps 1..2
    ]
    (forked,) = events(done.id, "forked")
    assert forked["forked"] == {"run_id": source.id, "step": 0, "transcript_rows": 3}

    status = http.get(f"/v1/runs/{done.id}", headers=people["bob"]).json()
    assert (status["forked_from_run"], status["forked_at_step"]) == (source.id, 0)
    assert http.get(f"/v1/runs/{source.id}", headers=people["bob"]).json()["forked_from_run"] is None
    fork_page = admin_client.get(reverse("admin:runs_run_change", args=[quote(done.id)])).content.decode()
    assert f">{source.id}</a> at step 0" in fork_page
    source_page = admin_client.get(reverse("admin:runs_run_change", args=[quote(source.id)])).content.decode()
    assert f">{done.id}</a> (at step 0, completed)" in source_page


def test_a_fork_with_an_agent_override_runs_that_agent_on_the_source_history(
    source: Run, http: httpx.Client, people: dict[str, Any]
) -> None:
    """`agent` names another agent of the tenant (an acme definition here): the fork is that
    agent's run (its system prompt and tools), over the source's transcript through the step."""
    reviewer = {"provider": "mock", "model": "mock-script", "tools": ["Context"], "system_prompt": "You review."}
    made_def = http.post(
        "/v1/_agentdef", headers=people["alice"], json={"op": "create", "name": "acme-reviewer", "overlay": reviewer}
    )
    assert made_def.status_code == 200, made_def.text
    prompt = 'Review this. MOCK_SCRIPT: [{"echo": true}]'
    made = fork(http, source.id, people["bob"], from_step=1, prompt=prompt, agent="acme-reviewer")
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["forked_from_run"], body["forked_at_step"]) == (source.id, 1)
    assert body["session_id"] != source.session_id
    done = wait_status(body["run_id"], RunStatus.COMPLETED, timeout=30)

    assert (done.agent_name, done.agent_def.tenant_id, done.agent_def.name) == (
        "acme-reviewer",
        "acme",
        "acme-reviewer",
    )
    assert (done.forked_from_run_id, done.forked_at_step) == (source.id, 1)
    assert (source.user_id, done.user_id) == ("alice", "bob")  # bob may not name a user: the fork is his (identity)
    kept = rows(source.id, max_step=1)
    assert [r for r, _ in kept] == ["user", "assistant", "user", "assistant", "user"]  # steps 0 and 1
    assert rows(done.id)[: len(kept)] == kept  # the source's rows through step 1, row for row
    seen = json.loads(events(done.id, "text")[-1]["text"])
    assert seen["system"] == "You review."  # its own system prompt
    assert seen["tools"] == ["Context"]  # the reviewer's tools, not scripted's (Context, Memory, Channel)
    assert seen["messages"] == [
        {"role": "user", "text": f"Test prompt. MOCK_SCRIPT: {json.dumps(SOURCE_SCRIPT)}"},
        {"role": "assistant", "text": "looking"},
        {"role": "user", "text": ""},  # step 0's tool result
        {"role": "assistant", "text": ""},  # step 1's tool call
        {"role": "user", "text": prompt},  # beside step 1's tool result: nothing of step 2
    ]
    (forked,) = events(done.id, "forked")
    assert forked["forked"] == {"run_id": source.id, "step": 1, "transcript_rows": 5}
    status = http.get(f"/v1/runs/{done.id}", headers=people["bob"]).json()
    assert (status["forked_from_run"], status["forked_at_step"]) == (source.id, 1)


def test_a_fork_without_a_prompt_continues_where_the_cut_left_off(
    source: Run, http: httpx.Client, people: dict[str, Any]
) -> None:
    made = fork(http, source.id, people["bob"], from_step=1)  # ends on step 1's tool result
    assert made.status_code == 201, made.text
    done = wait_status(made.json()["run_id"], RunStatus.COMPLETED, timeout=30)
    assert rows(done.id)[: len(rows(source.id, max_step=1))] == rows(source.id, max_step=1)
    assert shape(rows(done.id)) == shape(rows(source.id))  # the script plays on from step 2, as the source did
    assert not events(done.id, "user_input")  # no prompt of its own


def test_an_interactive_fork_of_an_ended_turn_waits_for_its_next_user_turn(
    source: Run, http: httpx.Client, people: dict[str, Any]
) -> None:
    refused = fork(http, source.id, people["bob"], from_step=2)  # ends on the model's answer
    assert (refused.status_code, refused.json()["code"]) == (422, "prompt_required")
    made = fork(http, source.id, people["bob"], from_step=2, interactive=True)
    assert made.status_code == 201, made.text
    run = Run.objects.get(id=made.json()["run_id"])
    assert (run.status, run.interactive) == (RunStatus.AWAITING_INPUT, True)  # parked: no doorbell, no worker
    assert [e["awaiting_input"] for e in events(run.id, "awaiting_input")] == [{"since_turn": 0}]
    services.run_input(principal=ACME, run_id=run.id, text='A new turn. MOCK_SCRIPT: [{"text": "diverged"}]')
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 2, timeout=30)
    assert events(run.id, "text")[-1]["text"] == "diverged"
    assert rows(run.id)[:6] == rows(source.id)  # the whole source (steps 0..2), then the new turn
    assert [role for role, _ in rows(run.id)[6:]] == ["user", "assistant"]
    services.run_cancel(principal=ACME, run_id=run.id, reason="test over")


def test_a_fork_refuses_a_step_out_of_range_a_split_pair_and_another_tenants_run(
    source: Run, http: httpx.Client, people: dict[str, Any]
) -> None:
    bob = people["bob"]
    for step in (3, -1, 2**40):
        refused = fork(http, source.id, bob, from_step=step, prompt="x")
        assert (refused.status_code, refused.json()["code"]) == (422, "step_out_of_range"), step
    hidden = fork(http, source.id, people["charlie"], from_step=0, prompt="x")  # tenant beta
    assert (hidden.status_code, hidden.json()["code"]) == (404, "not_found")
    assert fork(http, "r_nope", bob, from_step=0).status_code == 404
    bad = fork(http, source.id, bob, from_step=0, agent="no such agent")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_body")
    unknown = fork(http, source.id, bob, from_step=0, prompt="x", agent="nobody")
    assert (unknown.status_code, unknown.json()["code"]) == (400, "unknown_agent")

    subscribe = {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000, "max_messages": 1}
    waiting = scripted([{"tool": "Channel", "input": subscribe}, {"text": "got it"}])
    wait_status(waiting.id, RunStatus.WAITING_CHANNEL, timeout=30)
    split = fork(http, waiting.id, bob, from_step=0, prompt="x")
    assert (split.status_code, split.json()["code"]) == (422, "split_tool_pair")
    assert Run.objects.filter(forked_from_run_id__in=[source.id, waiting.id]).count() == 0  # nothing was started
    services.run_cancel(principal=ACME, run_id=waiting.id, reason="test over")


def test_an_admin_never_forks_another_tenants_run_into_its_own(source: Run) -> None:
    request = ForkRequest(from_step=0, prompt="x")
    with pytest.raises(NotFound) as hidden:  # ALICE (admin, tenant "") reads acme's run: no copy across tenants
        run_fork(principal=ALICE, run_id=source.id, request=request)
    assert hidden.value.code == "not_found"
    assert not Run.objects.filter(forked_from_run_id=source.id).exists()


def test_a_parked_fork_skips_the_admission_queue(source: Run, settings: Any) -> None:
    """With admission full, a fork that waits for its next user turn parks at awaiting_input (it holds
    an admission slot, as every parked interactive run does) instead of queueing for a model turn."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, max_concurrent_runs=1, max_queue_depth=50)
    holder = scripted([{"tool": "Channel", "input": PARK}])  # live, admitted or waiting: the next run would wait
    assert backpressure.limits().max_concurrent_runs == 1
    parked = run_fork(principal=ACME, run_id=source.id, request=ForkRequest(from_step=2, interactive=True))
    assert Run.objects.get(id=parked.id).status == RunStatus.AWAITING_INPUT  # not waiting_slot, then queued
    for run in (parked, holder):
        services.run_cancel(principal=ACME, run_id=run.id, reason="test over")
