"""The run RPCs over a real gRPC server, web-less: Postgres, Redis and Celery workers as in
production, the project's own stubs as the client."""

from __future__ import annotations

import json

import grpc
import pytest

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.runs.models import Run, RunStatus
from tests.conftest import wait_status
from tests.factories.grpc import user_text

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_run_streams_session_agent_then_the_run_events(stub: pb_grpc.LoomcycleStub) -> None:
    events = list(stub.Run(pb.RunRequest(agent="echo", segments=user_text("hi"), user_id="u1"), timeout=60))
    assert [e.type for e in events] == ["session", "agent", "started", "text", "usage", "done"]
    session, agent = events[0], events[1]
    envelope = json.loads(agent.error)
    assert session.text.startswith("s_") and envelope["session_id"] == session.text
    assert agent.text == envelope["agent_id"] and envelope["run_id"].startswith("r_")
    assert events[3].text == "ok" and events[5].stop_reason == "end_turn"
    assert events[4].usage.input_tokens > 0 and events[4].usage.model == "mock-generic"
    got = stub.GetRun(pb.GetRunRequest(run_id=envelope["run_id"]), timeout=10)
    assert (got.status, got.agent_id, got.user_id, got.agent) == ("completed", agent.text, "u1", "echo")
    assert got.started_at.seconds > 0 and got.completed_at.seconds >= got.started_at.seconds
    assert stub.GetAgent(pb.GetAgentRequest(agent_id=agent.text), timeout=10).run_id == envelope["run_id"]


def test_stream_run_replays_from_a_seq_gap_free(stub: pb_grpc.LoomcycleStub) -> None:
    events = list(stub.Run(pb.RunRequest(agent="echo", segments=user_text("hi")), timeout=60))
    run_id = json.loads(events[1].error)["run_id"]
    whole = [e.type for e in stub.StreamRun(pb.StreamRunRequest(run_id=run_id, from_seq=0), timeout=30)]
    assert whole == ["steer", "started", "text", "usage", "done"]  # user_input replays as steer (SPEC 3.4)
    tail = [e.type for e in stub.StreamRun(pb.StreamRunRequest(run_id=run_id, from_seq=4), timeout=30)]
    assert tail == whole[-len(tail) :] and tail[-1] == "done" and len(tail) < len(whole)


def test_interactive_run_steered_with_run_input_then_cancelled(stub: pb_grpc.LoomcycleStub) -> None:
    stream = stub.Run(pb.RunRequest(agent="chat", segments=user_text("hello"), interactive=True), timeout=60)
    first = [next(stream), next(stream)]
    ids = json.loads(first[1].error)
    seen = []
    for event in stream:
        seen.append(event.type)
        if event.type == "awaiting_input":
            break
    reply = stub.RunInput(pb.RunInputRequest(run_id=ids["run_id"], text="more please"), timeout=10)
    assert reply.delivered and reply.run_id == ids["run_id"]
    for event in stream:
        seen.append(event.type)
        if event.type == "steer" and event.user_input.text == "more please":
            break
    cancelled = stub.CancelAgent(pb.CancelAgentRequest(agent_id=ids["agent_id"], reason="done here"), timeout=10)
    assert cancelled.cancelled_count == 1
    wait_status(ids["run_id"], RunStatus.CANCELLED)
    stream.cancel()
    again = stub.CancelAgent(pb.CancelAgentRequest(agent_id=ids["agent_id"]), timeout=10)
    assert again.cancelled_count == 0  # idempotent on an ended run, as loomcycle's


def test_continue_and_transcript_and_list_user_agents(stub: pb_grpc.LoomcycleStub) -> None:
    events = list(stub.Run(pb.RunRequest(agent="echo", segments=user_text("one"), user_id="carol"), timeout=60))
    session_id = events[0].text
    more = list(stub.Continue(pb.ContinueRequest(session_id=session_id, segments=user_text("two")), timeout=60))
    assert more[0].type == "session" and more[0].text == session_id and more[-1].type == "done"
    transcript = stub.GetTranscript(pb.GetTranscriptRequest(session_id=session_id), timeout=10)
    runs = {e.run_id for e in transcript.events}
    assert len(runs) == 2 and all(e.session_id == session_id for e in transcript.events)
    seqs = [(e.run_id, e.seq) for e in transcript.events]
    assert seqs == sorted(seqs, key=lambda p: (p[0] != transcript.events[0].run_id, p[1]))
    assert "done" in {e.type for e in transcript.events}
    mine = stub.ListUserAgents(pb.ListUserAgentsRequest(user_id="carol", status="all"), timeout=10)
    assert {a.run_id for a in mine.agents} == runs


def test_bad_input_is_a_status_not_a_crash(stub: pb_grpc.LoomcycleStub) -> None:
    cases = [
        (lambda: list(stub.Run(pb.RunRequest(agent="echo"), timeout=20)), grpc.StatusCode.INVALID_ARGUMENT, "no input"),
        (
            lambda: list(stub.Run(pb.RunRequest(agent="no-such", segments=user_text("x")), timeout=20)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown agent",
        ),
        (
            lambda: list(stub.Run(pb.RunRequest(agent="bad agent!", segments=user_text("x")), timeout=20)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "agent",
        ),
        (
            lambda: stub.GetRun(pb.GetRunRequest(run_id="../etc"), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT,
            "run_id",
        ),
        (lambda: stub.GetRun(pb.GetRunRequest(run_id="r_0000000000000000"), timeout=10), grpc.StatusCode.NOT_FOUND, ""),
        (
            lambda: stub.RunInput(pb.RunInputRequest(run_id="r_x", text="t", model="m"), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model",
        ),
        (
            lambda: list(stub.StreamRun(pb.StreamRunRequest(run_id="r_x", from_seq=-1), timeout=10)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "from_seq",
        ),
        (
            lambda: stub.GetTranscript(pb.GetTranscriptRequest(session_id="s_0000000000000000"), timeout=10),
            grpc.StatusCode.NOT_FOUND,
            "session",
        ),
        (lambda: stub.Config(pb.ConfigRequest(), timeout=10), grpc.StatusCode.UNIMPLEMENTED, "Config"),
    ]
    for call, code, text in cases:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == code, (info.value.code(), info.value.details())
        assert text.lower() in info.value.details().lower()
    assert stub.Health(pb.HealthRequest(), timeout=10).ok  # the server went on


def test_web_search_filter_on_run_request_reaches_the_run_and_is_not_announced_inert(
    stub: pb_grpc.LoomcycleStub,
) -> None:
    """Every field set on RunRequest reaches POST /v1/runs's schema, never dropped in the transport:
    web_search_filter (acted on since issue 40) is pinned on the run when allowed_hosts narrows."""
    hosts = pb.HostAllowlist(list=["localhost"])
    request = pb.RunRequest(agent="echo", segments=user_text("hi"), allowed_hosts=hosts, web_search_filter="keep")
    events = list(stub.Run(request, timeout=60))
    assert events[-1].type == "done"
    run_id = json.loads(events[1].error)["run_id"]
    assert Run.objects.get(id=run_id).routing["web_search_filter"] == "keep"
    assert [e for e in events if e.type == "capability_inert"] == []
