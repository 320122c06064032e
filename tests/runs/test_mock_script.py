"""`mock-script` through real runs (issue 17, part 1): real workers, the
engine's retries and fallback, steering, continuation and cancel. The
provider's own grammar is tested in tests/gateway/test_mock_script.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.db import connection

from apps.channels import services as channels
from apps.channels.streams import Stream
from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment, messages_from_rows
from apps.substrate.models import ChannelDef
from tests.conftest import ALICE, wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def scripted(steps: list[dict[str, Any]], agent: str = "scripted", **kw: Any) -> Run:
    prompt = f"Test prompt. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ALICE, data=data)


def events(run_id: str, *types: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    return [{"type": e.type, **e.payload} for e in rows if not types or e.type in types]


def final_text(run_id: str) -> str:
    texts = events(run_id, "text")
    return str(texts[-1]["text"]) if texts else ""


def test_parallel_tool_calls_in_one_turn_then_text(stack: WorkerPool) -> None:
    run = scripted(
        [
            {"tools": [{"tool": "Context", "input": {"op": "self"}}, {"tool": "Context", "input": {"op": "time"}}]},
            {"text": "both answered"},
        ]
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    calls = events(run.id, "tool_call")
    assert [c["tool_use"]["input"]["op"] for c in calls] == ["self", "time"]
    results = events(run.id, "tool_result")
    assert sorted(r["tool_use"]["id"] for r in results) == sorted(c["tool_use"]["id"] for c in calls)
    assert not any(r["is_error"] for r in results)
    rows = TranscriptEntry.objects.filter(run_id=run.id).order_by("idx")
    messages = messages_from_rows([(r.role, r.content) for r in rows])  # as the next model call would see it
    assert [(m["role"], [b["type"] for b in m["content"]]) for m in messages] == [
        ("user", ["text"]),
        ("assistant", ["tool_use", "tool_use"]),
        ("user", ["tool_result", "tool_result"]),
        ("assistant", ["text"]),
    ]
    assert final_text(run.id) == "both answered"


def test_echo_after_a_steer_shows_the_steering_text(stack: WorkerPool) -> None:
    subscribe = {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000, "max_messages": 1}
    run = scripted([{"tool": "Channel", "input": subscribe}, {"echo": True}])
    wait_status(run.id, RunStatus.WAITING_CHANNEL, timeout=30)  # parked: the steer waits for the next iteration
    services.run_input(principal=ALICE, run_id=run.id, text="steer: also mention the weather")
    declared = ChannelDef.objects.get(name="handoff", tenant_id="")
    channels.publish(stream=Stream("", "handoff", "global", ""), declared=declared, value="go", published_by="_test")
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    seen = json.loads(final_text(run.id))
    assert sorted(seen["tools"]) == ["Channel", "Context", "Memory"]
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant", "user"]
    assert seen["messages"][0]["text"].startswith("Test prompt. MOCK_SCRIPT:")
    assert seen["messages"][2]["text"] == "steer: also mention the weather"  # beside the tool result


def test_an_interactive_run_plays_the_next_step_on_each_turn(stack: WorkerPool) -> None:
    run = scripted([{"text": "first turn"}, {"echo": True}], interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    assert final_text(run.id) == "first turn"
    services.run_input(principal=ALICE, run_id=run.id, text="second turn")
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 2, timeout=30)
    seen = json.loads(final_text(run.id))
    assert [(m["role"], m["text"].split(" MOCK_SCRIPT")[0]) for m in seen["messages"]] == [
        ("user", "Test prompt."),
        ("assistant", "first turn"),
        ("user", "second turn"),
    ]


def test_a_sleeping_step_is_cancelled_within_a_second(stack: WorkerPool) -> None:
    run = scripted([{"text": "too late", "sleep_ms": 120_000}])
    wait_for(lambda: events(run.id, "started"), timeout=30)
    with connection.cursor() as cur:  # measured on Postgres's clock, which stamps completed_at too
        cur.execute("SELECT now()")
        (asked,) = cur.fetchone()
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="test cancel")
    done = wait_status(run.id, RunStatus.CANCELLED, timeout=10)
    took = (done.completed_at - asked).total_seconds()
    assert took < 1.0, f"cancel took {took:.2f} s"
    assert done.stop_reason == "test cancel"
    assert not events(run.id, "text")


def test_a_scripted_429_is_retried_then_falls_back_to_mock_stable(stack: WorkerPool) -> None:
    run = scripted([{"text": "answered by the fallback", "error": 429}], agent="scripted-fallback")
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    retries = events(run.id, "retry")
    assert len(retries) == 3  # the default user tier's retry_attempts
    assert all(r["retry"]["error"].startswith("mock 429: rate_limited (scripted)") for r in retries)
    (fallback,) = events(run.id, "provider_fallback")
    assert (fallback["fallback"]["failed_provider"], fallback["fallback"]["new_provider"]) == ("mock", "mock-stable")
    assert fallback["fallback"]["reason"] == "rate_limited"
    assert final_text(run.id) == "answered by the fallback"
    assert (done.provider, done.model) == ("mock-stable", "mock-script")


def test_repeat_plays_the_last_step_until_the_iteration_cap(stack: WorkerPool) -> None:
    run = scripted([{"text": "tick", "tool": "Context", "input": {"op": "time"}, "repeat": True}], max_iterations=4)
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert done.stop_reason == "max_iterations"
    assert len(events(run.id, "tool_call")) == 4
    ids = [c["tool_use"]["id"] for c in events(run.id, "tool_call")]
    assert len(set(ids)) == 4  # one id per turn, though every turn plays the same step


def test_a_malformed_script_fails_the_run_with_a_clear_reason(stack: WorkerPool, http: httpx.Client) -> None:
    body = {"agent": "scripted", "prompt": 'MOCK_SCRIPT: [{"tool": "Context"}, {"tol": "Memory"}]'}
    with http.stream("POST", "/v1/runs", json=body) as resp:
        assert resp.status_code == 200
        frames = [line for line in resp.iter_lines() if line.startswith("data: ")]
    last = json.loads(frames[-1].removeprefix("data: "))
    assert last["type"] == "error"
    assert "step 1: unknown key 'tol'" in last["error"]
    run_id = json.loads(frames[1].removeprefix("data: "))["run_id"]  # the `agent` frame
    status = http.get(f"/v1/runs/{run_id}").json()
    assert (status["status"], status["stop_reason"]) == ("failed", "invalid_mock_script")
    assert status["error"].startswith("mock 400: mock-script: step 1: unknown key 'tol'")
    assert not events(run_id, "retry")  # not retryable: the script will not change
