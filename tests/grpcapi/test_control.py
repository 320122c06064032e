"""Run control over gRPC: resolve an Interruption.ask, turn-cancel, queue a compaction, replay
a session; each refusal is the route's, as a status."""

from __future__ import annotations

import json

import grpc
import pytest

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.runs.models import Interrupt, RunStatus
from tests.conftest import wait_status
from tests.factories.grpc import user_text

pytestmark = pytest.mark.usefixtures("agents", "stack")

ASK = {"op": "ask", "question": "Deploy?", "options": ["yes", "no"]}


def started(stub: pb_grpc.LoomcycleStub, request: pb.RunRequest) -> dict[str, str]:
    """Start a run and leave it running: its ids from the registration frame."""
    stream = stub.Run(request, timeout=60)
    next(stream)
    ids: dict[str, str] = json.loads(next(stream).error)
    stream.cancel()
    return ids


def test_resolve_interrupt_answers_the_ask_and_the_run_finishes(stub: pb_grpc.LoomcycleStub) -> None:
    script = "MOCK_SCRIPT: " + json.dumps([{"tools": [{"tool": "Interruption", "input": ASK}]}, {"text": "done"}])
    ids = started(stub, pb.RunRequest(agent="asker", segments=user_text(script)))
    wait_status(ids["run_id"], RunStatus.AWAITING_INTERRUPT, timeout=30)
    row = Interrupt.objects.get(run_id=ids["run_id"])
    ask = pb.ResolveInterruptRequest(run_id=ids["run_id"], interrupt_id=row.id, answer="yes", resolved_by="ops")
    reply = stub.ResolveInterrupt(ask, timeout=10)
    assert (reply.interrupt_id, reply.status) == (row.id, "resolved")
    wait_status(ids["run_id"], RunStatus.COMPLETED, timeout=30)
    with pytest.raises(grpc.RpcError) as again:  # no longer pending: the route's 409
        stub.ResolveInterrupt(ask, timeout=10)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_cancel_turn_compact_and_replay(stub: pb_grpc.LoomcycleStub) -> None:
    events = list(stub.Run(pb.RunRequest(agent="echo", segments=user_text("hi")), timeout=60))
    done = json.loads(events[1].error)
    with pytest.raises(grpc.RpcError) as whole:  # not interactive: cancel the whole run instead
        stub.CancelTurn(pb.CancelTurnRequest(run_id=done["run_id"]), timeout=10)
    assert whole.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not interactive" in whole.value.details()
    with pytest.raises(grpc.RpcError) as ended:
        stub.CompactRun(pb.CompactRunRequest(run_id=done["run_id"]), timeout=10)
    assert ended.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
    chat = started(stub, pb.RunRequest(agent="compactor", segments=user_text('MOCK_SCRIPT: [{"text": "a"}]')))
    wait_status(chat["run_id"], RunStatus.AWAITING_INPUT, timeout=30)
    queued = stub.CompactRun(pb.CompactRunRequest(run_id=chat["run_id"]), timeout=10)
    assert (queued.run_id, queued.applied, queued.compacted) == (chat["run_id"], "queued", False)
    replay = stub.ReplaySession(pb.ReplaySessionRequest(session_id=done["session_id"]), timeout=20)
    assert replay.new_session_id.startswith("s_") and replay.new_session_id != done["session_id"]
    assert replay.events_copied > 0 and replay.seed_run_id.startswith("r_")
    with pytest.raises(grpc.RpcError) as unsupported:
        stub.ReplaySession(pb.ReplaySessionRequest(session_id=done["session_id"], compress=True), timeout=10)
    assert unsupported.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "compress" in unsupported.value.details()
    stub.CancelAgent(pb.CancelAgentRequest(agent_id=chat["agent_id"]), timeout=10)
