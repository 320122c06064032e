"""This runtime's agents calling a remote A2A agent (an SDK-built server on loopback, tests/a2a/peer.py)
through an A2AAgentDef tool: the answer is the tool's result with the run's credential sent in the
header and redacted from the text; a failing peer is a clear tool error; a peer that never answers
parks the run on a row (no worker holds it) that the run's cancel ends, telling the peer, or that
beat's sweep answers with an error past the deadline, waking the run through apps.runs.wake.

Real workers, Postgres and Redis; the peer is the SDK's own server."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.a2a import calls
from apps.a2a.models import A2ACall
from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from tests.a2a import peer
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")

SECRET = "peer-secret-7f3a9b2c4d5e6f70"
ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


@pytest.fixture
def net(settings: Any) -> Any:
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        http_host_allowlist=("localhost", "127.0.0.1"),
        http_private_host_allowlist=("localhost",),
        http_caller_authoritative=False,
    )
    return settings


@pytest.fixture
def remote(net: Any) -> Iterator[peer.Seen]:
    """The loopback peer as acme's A2AAgentDef `peer`, and acme's agent `caller` that may call it."""
    with peer.serving() as (url, seen):
        author = substrate.Author(tenant_id="acme", subject="alice")
        overlay = {
            "endpoint": url,
            "auth": {"bearer_credential_ref": "peer_token"},
            "expected_skills": [{"id": s} for s in ("answer", "stall", "fail")],
        }
        substrate.def_create(get_kind("a2aagent"), author, {"name": "peer", "overlay": overlay})
        caller = {"provider": "mock", "model": "mock-script", "tools": ["a2a__peer__*"]}
        substrate.def_create(get_kind("agent"), author, {"name": "caller", "overlay": caller})
        yield seen


def call_run(skill: str, prompt: str = "hello") -> Run:
    steps = [{"tools": [{"tool": f"a2a__peer__{skill}", "input": {"prompt": prompt}}]}, {"text": "done"}]
    data = services.RunCreate(
        agent="caller",
        segments=[Segment(text="MOCK_SCRIPT: " + json.dumps(steps))],
        credentials={"peer_token": SECRET},
    )
    return services.run_create(principal=ACME, data=data)


def tool_result(run_id: str) -> dict[str, Any]:
    (result,) = [e.payload for e in RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")]
    return dict(result)


def test_a_peers_answer_is_the_tool_result_with_the_credential_sent_and_redacted(remote: peer.Seen) -> None:
    run = call_run("answer")
    assert wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60).status == RunStatus.COMPLETED
    result = tool_result(run.id)
    assert result["is_error"] is False
    assert result["text"] == "peer heard 'hello' with Bearer [redacted:run.credentials.peer_token]"
    assert remote.authorization == [f"Bearer {SECRET}"]  # the run's credential went in the header, and only there
    assert not RunEvent.objects.filter(run_id=run.id, payload__icontains=SECRET).exists()


def test_a_peer_that_fails_the_task_is_a_clear_tool_error(remote: peer.Seen) -> None:
    run = call_run("fail")
    wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60)
    result = tool_result(run.id)
    assert result["is_error"] is True
    assert result["text"] == "a2a peer 'peer': the task ended failed: the peer broke: quota gone"


def test_a_peer_that_stalls_parks_the_run_on_a_row_and_the_runs_cancel_tells_the_peer(remote: peer.Seen) -> None:
    run = call_run("stall")
    parked = wait_status(run.id, RunStatus.WAITING_CHILDREN, timeout=60)
    assert (parked.lease_owner, parked.lease_until) == ("", None)  # no worker waits on the peer
    row = A2ACall.objects.get(run_id=run.id)
    assert [row.task_id] == remote.stalled and row.tool_name == "a2a__peer__stall"
    assert SECRET not in row.credentials_sealed  # sealed to the run, not in clear

    services.run_cancel(principal=ACME, run_id=run.id)
    assert wait_status(run.id, RunStatus.CANCELLED).status == RunStatus.CANCELLED
    wait_for(lambda: remote.cancelled == [row.task_id], timeout=30)  # the peer heard of it
    wait_for(lambda: not A2ACall.objects.filter(run_id=run.id).exists(), timeout=30)


def test_a_parked_call_past_its_deadline_is_answered_by_the_sweep_and_wakes_the_run(remote: peer.Seen) -> None:
    run = call_run("stall")
    wait_status(run.id, RunStatus.WAITING_CHILDREN, timeout=60)
    row = A2ACall.objects.get(run_id=run.id)
    past = timezone.now() - timedelta(seconds=1)
    A2ACall.objects.filter(id=row.id).update(deadline=past, wake_at=past)

    assert calls.calls_due() == 1  # the sweep beat runs, here in-process
    done = wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60)
    assert done.status == RunStatus.COMPLETED  # woken with the tool's error, the model went on
    result = tool_result(run.id)
    assert result["is_error"] is True and "did not answer within" in result["text"]
    assert remote.cancelled == [row.task_id]
    assert not A2ACall.objects.filter(run_id=run.id).exists()
