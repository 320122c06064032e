"""Turn-cancel of an interactive run (SPEC 4.7, `POST /v1/runs/{id}/cancel`, issue 22):
the current model turn or tool batch stops, what was done is kept, tool_uses that
did not run get an `is_error` result, `turn_cancelled` is appended and the run
re-parks at awaiting_input; the next input continues it. Real workers and a web
process; the agents play mock-script (tests/loomcycle.test.yaml: turnfork, scripted)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import transaction

from apps.core.types import Principal
from apps.runs import services
from apps.runs.engine import turncancel
from apps.runs.models import Run, RunEvent, RunStatus, ToolCallRecord, TranscriptEntry
from apps.runs.prompt import Segment, messages_from_rows
from tests.conftest import ALICE, for_sandbox, run_row, wait_for, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

VOLUME = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "volumes-static" / "turnfork"
ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


@pytest.fixture
def volume() -> Iterator[Path]:
    """The `turnfork` volume of tests/loomcycle.test.yaml, empty for each test."""
    shutil.rmtree(VOLUME, ignore_errors=True)
    for_sandbox(VOLUME)  # its Bash commands write here
    yield VOLUME
    shutil.rmtree(VOLUME, ignore_errors=True)


def scripted(steps: list[dict[str, Any]], agent: str = "turnfork", principal: Principal = ALICE, **kw: Any) -> Run:
    prompt = f"Test prompt. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=principal, data=data)


def events(run_id: str, *types: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    return [{"type": e.type, **e.payload} for e in rows if not types or e.type in types]


def transcript(run_id: str) -> list[dict[str, Any]]:
    rows = TranscriptEntry.objects.filter(run_id=run_id).order_by("idx")
    return messages_from_rows([(r.role, r.content) for r in rows])


def in_model_hold(run_id: str) -> bool:
    """The worker has been inside the run's first iteration for a lease heartbeat (1 s in the
    suite) since its claim: the mock streamed the turn's output within milliseconds of the
    call and is holding the turn open (`hold_ms`)."""
    run = run_row(run_id)
    started = RunEvent.objects.filter(run_id=run_id, type="started").values_list("created_at", flat=True).first()
    leased = run.lease_owner != "" and run.last_heartbeat_at is not None
    return bool(leased and started is not None and run.last_heartbeat_at > started)


def test_a_cut_model_turn_keeps_its_text_and_tool_uses_reparks_and_the_next_input_continues(
    stack: WorkerPool,
) -> None:
    held = {"text": "partial answer", "tool": "Context", "input": {"op": "time"}, "hold_ms": 120_000}
    run = scripted([held, {"echo": True}])
    wait_for(lambda: in_model_hold(run.id), timeout=30)
    answer = turncancel.run_turn_cancel(principal=ALICE, run_id=run.id, reason="user pressed stop")
    assert answer == {"run_id": run.id, "stopped": True, "parked": False, "reason": "user pressed stop"}
    parked = wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=10)
    assert (parked.stop_reason, parked.turn_cancel_requested) == ("turn_cancelled", False)
    (cut,) = events(run.id, "turn_cancelled")
    assert cut["turn_cancelled"] == {"reason": "user pressed stop", "since_turn": 0}
    assert [e["type"] for e in events(run.id)][-5:] == [
        "text",
        "tool_call",
        "tool_result",
        "turn_cancelled",
        "awaiting_input",
    ]
    (result,) = events(run.id, "tool_result")
    assert (result["text"], result["is_error"]) == ("cancelled by operator", True)
    use_id = result["tool_use"]["id"]
    assert transcript(run.id)[1:] == [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "partial answer"}, {**result["tool_use"], "type": "tool_use"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use_id, "content": "cancelled by operator", "is_error": True}
            ],
        },
    ]
    assert not ToolCallRecord.objects.filter(run_id=run.id).exists()  # the Context call never ran

    services.run_input(principal=ALICE, run_id=run.id, text="go on")
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 2, timeout=30)
    seen = json.loads(events(run.id, "text")[-1]["text"])
    assert [(m["role"], m["text"].split(" MOCK_SCRIPT")[0]) for m in seen["messages"]] == [
        ("user", "Test prompt."),
        ("assistant", "partial answer"),
        ("user", "go on"),  # beside the synthesised tool result
    ]
    assert run_row(run.id).status == RunStatus.AWAITING_INPUT


def test_a_cut_tool_batch_keeps_finished_results_and_errors_the_undispatched_calls(
    stack: WorkerPool, volume: Path
) -> None:
    parallel = settings.LOOMCYCLE.tool_parallelism  # the workers' (the suite's environment is theirs)
    calls = [
        {"tool": "Bash", "input": {"command": f"touch started.{i}; exec sleep 120", "timeout_seconds": 150}}
        for i in range(parallel + 1)
    ]
    run = scripted([{"tools": calls}, {"text": "resumed"}])
    wait_for(lambda: len(list(volume.glob("started.*"))) == parallel, timeout=30)  # the pool is full
    turncancel.run_turn_cancel(principal=ALICE, run_id=run.id)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=10)
    assert not (volume / f"started.{parallel}").exists()  # the last call was never dispatched
    results = {r["tool_use"]["input"]["command"]: r for r in events(run.id, "tool_result")}
    assert len(results) == parallel + 1
    last = results.pop(calls[-1]["input"]["command"])
    assert (last["text"], last["is_error"]) == ("cancelled by operator", True)
    assert all(r["is_error"] and r["text"].endswith("[killed: run cancelled]") for r in results.values())
    (cut,) = events(run.id, "turn_cancelled")
    assert cut["turn_cancelled"]["reason"] == "cancelled by operator"  # the default reason
    messages = transcript(run.id)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    uses = [b["id"] for b in messages[1]["content"]]
    assert [b["tool_use_id"] for b in messages[2]["content"]] == uses  # every tool_use has its result, in order
    assert set(ToolCallRecord.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"finished"}

    services.run_input(principal=ALICE, run_id=run.id, text="carry on")
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 2, timeout=30)
    assert events(run.id, "text")[-1]["text"] == "resumed"


def test_turn_cancel_refuses_what_has_no_turn_and_whole_run_cancel_still_ends_the_run(
    stack: WorkerPool, http: httpx.Client, people: dict[str, Any]
) -> None:
    bob, charlie = people["bob"], people["charlie"]  # bob: acme, runs:create; charlie: tenant beta
    batch = scripted([{"text": "hello"}], agent="scripted", principal=ACME, interactive=False)
    wait_status(batch.id, RunStatus.COMPLETED, timeout=30)
    refused = http.post(f"/v1/runs/{batch.id}/cancel", json={}, headers=bob)
    assert (refused.status_code, refused.json()["code"]) == (409, "not_interactive")

    chat = scripted([{"text": "first turn"}], principal=ACME)
    wait_status(chat.id, RunStatus.AWAITING_INPUT, timeout=30)
    parked = http.post(f"/v1/runs/{chat.id}/cancel", headers=bob)  # no body: the reason is optional
    assert (parked.status_code, parked.json()["code"]) == (409, "not_mid_turn")
    assert "awaiting_input" in parked.json()["error"]
    hidden = http.post(f"/v1/runs/{chat.id}/cancel", json={}, headers=charlie)
    assert (hidden.status_code, hidden.json()["code"]) == (404, "not_found")
    bad = http.post(f"/v1/runs/{chat.id}/cancel", json={"reason": "x" * 1025}, headers=bob)
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_body")

    ended = http.post(f"/v1/agents/{chat.agent_id}/cancel", json={"reason": "done"}, headers=bob)
    assert (ended.status_code, ended.json()["cancelled"]) == (200, True)
    assert wait_status(chat.id, RunStatus.CANCELLED, timeout=10).stop_reason == "done"
    after = http.post(f"/v1/runs/{chat.id}/cancel", headers=bob)
    assert (after.status_code, after.json()["code"]) == (409, "not_mid_turn")
    assert "has ended" in after.json()["error"]


def test_a_turn_flagged_before_its_claim_keeps_its_input_and_never_calls_the_model(stack: WorkerPool) -> None:
    run = scripted([{"text": "first"}, {"echo": True}])
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    with transaction.atomic():  # the wake's doorbell and the flag commit together: the claim sees the flag
        services.run_input(principal=ALICE, run_id=run.id, text="cut input")
        turncancel.run_turn_cancel(principal=ALICE, run_id=run.id, reason="changed my mind")
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 2, timeout=30)
    assert [e["type"] for e in events(run.id)][-3:] == ["user_input", "turn_cancelled", "awaiting_input"]
    assert len(events(run.id, "usage")) == 1  # the first turn's only: the cut turn made no model call
    assert [m["role"] for m in transcript(run.id)] == ["user", "assistant", "user"]

    services.run_input(principal=ALICE, run_id=run.id, text="second")
    wait_for(lambda: len(events(run.id, "awaiting_input")) == 3, timeout=30)
    seen = json.loads(events(run.id, "text")[-1]["text"])
    assert [m["text"] for m in seen["messages"][1:]] == ["first", "cut input\nsecond"]
