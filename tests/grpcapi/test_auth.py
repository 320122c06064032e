"""Auth and tenancy over gRPC, as over HTTP: the matrix covers every served RPC (a new one
without a probe here fails the test). Tenant acme (alice) owns an interactive run, its
session and an AgentDef; a token of another tenant asks for each of them and for one that
exists nowhere, and the two answers must be the same status (another tenant's resource is
as absent as a missing one, never PERMISSION_DENIED) and carry none of acme's data. Without a
token, or with a wrong one, every RPC but Health is UNAUTHENTICATED; an RPC beyond the token's
scopes is PERMISSION_DENIED, as the mirrored HTTP route is 403."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from apps.grpcapi import servicer
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.runs.models import Run, RunStatus
from apps.substrate import tokens
from apps.substrate.channeldefs import ChannelSpec, channeldef_create
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")

MARK = "acmegrpc5c1e"
SC = grpc.StatusCode
Ids = dict[str, str]
MISSING: Ids = {
    "run_id": "r_00000000deadbeef",
    "agent_id": "a_00000000deadbeef",
    "session_id": "s_00000000deadbeef",
    "def_id": "def_00000000deadbeef",
    "user_id": "nobody-here",
    "memory_key": "no-such-key",
    "channel": "no-such-channel",
    "volume": "no-such-volume",
}


def segs(text: str) -> list[pb.PromptSegment]:
    return [pb.PromptSegment(role="user", content=[pb.PromptContentBlock(type="trusted-text", text=text)])]


def sub(data: dict[str, Any]) -> pb.SubstrateRequest:
    return pb.SubstrateRequest(input_json=json.dumps(data).encode())


# Each served RPC: the request naming a resource (acme's, or the missing one).
PROBES: dict[str, Callable[[Ids], Any]] = {
    "Run": lambda i: pb.RunRequest(agent="echo", session_id=i["session_id"], segments=segs("probe")),
    "Continue": lambda i: pb.ContinueRequest(session_id=i["session_id"], segments=segs("probe")),
    "StreamRun": lambda i: pb.StreamRunRequest(run_id=i["run_id"]),
    "GetRun": lambda i: pb.GetRunRequest(run_id=i["run_id"]),
    "GetAgent": lambda i: pb.GetAgentRequest(agent_id=i["agent_id"]),
    "CancelAgent": lambda i: pb.CancelAgentRequest(agent_id=i["agent_id"]),
    "RunInput": lambda i: pb.RunInputRequest(run_id=i["run_id"], text="probe"),
    "GetTranscript": lambda i: pb.GetTranscriptRequest(session_id=i["session_id"]),
    "ListUserAgents": lambda i: pb.ListUserAgentsRequest(user_id=i["user_id"], status="all"),
    "ListChildRuns": lambda i: pb.ListChildRunsRequest(parent_run_id=i["run_id"]),
    "StreamUserRunStates": lambda i: pb.StreamUserRunStatesRequest(user_id=i["user_id"]),
    "AgentDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "SkillDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "MCPServerDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "ScheduleDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "WebhookDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "A2AServerCardDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "A2AAgentDef": lambda i: sub({"op": "get", "def_id": i["def_id"]}),
    "OperatorTokenDef": lambda i: sub({"op": "list"}),
    "VolumeDef": lambda i: sub({"op": "get", "name": i["volume"]}),
    "PauseRuntime": lambda i: pb.PauseRuntimeRequest(timeout_ms=1),
    "ResumeRuntime": lambda i: pb.ResumeRuntimeRequest(),
    "GetRuntimeState": lambda i: pb.GetRuntimeStateRequest(),
    "Health": lambda i: pb.HealthRequest(),
    "Memory": lambda i: sub({"op": "get", "scope": "user", "scope_id": "acme-user", "key": i["memory_key"]}),
    "ListChannels": lambda i: pb.ListChannelsRequest(),
    "PublishChannel": lambda i: pb.PublishChannelRequest(channel=i["channel"], payload=b"1"),
    "SubscribeChannel": lambda i: pb.SubscribeChannelRequest(channel=i["channel"], from_cursor="cur_0"),
    "PeekChannel": lambda i: pb.PeekChannelRequest(channel=i["channel"]),
    "AckChannel": lambda i: pb.AckChannelRequest(channel=i["channel"], cursor="cur_0"),
    "AwaitChannels": lambda i: pb.AwaitChannelsRequest(channels=[i["channel"]]),
    "BroadcastChannels": lambda i: pb.BroadcastChannelsRequest(channels=[i["channel"]], payload=b"1"),
    "SpawnRunBatch": lambda i: pb.BatchSpawnRequest(
        spawns=[pb.RunRequest(agent="echo", session_id=i["session_id"], segments=segs("probe"))], mode="detach"
    ),
    "CancelTurn": lambda i: pb.CancelTurnRequest(run_id=i["run_id"]),
    "CompactRun": lambda i: pb.CompactRunRequest(run_id=i["run_id"]),
    "ReplaySession": lambda i: pb.ReplaySessionRequest(session_id=i["session_id"]),
    "ResolveInterrupt": lambda i: pb.ResolveInterruptRequest(run_id=i["run_id"], interrupt_id="intr_x", answer="y"),
    "CreateSnapshot": lambda i: pb.CreateSnapshotRequest(description="probe"),
    "ListSnapshots": lambda i: pb.ListSnapshotsRequest(),
    "GetSnapshot": lambda i: pb.GetSnapshotRequest(snapshot_id="snap_1_deadbeef"),
    "ExportSnapshot": lambda i: pb.ExportSnapshotRequest(snapshot_id="snap_1_deadbeef"),
    "RestoreSnapshot": lambda i: pb.RestoreSnapshotRequest(snapshot_id="snap_1_deadbeef"),
    "DeleteSnapshot": lambda i: pb.DeleteSnapshotRequest(snapshot_id="snap_1_deadbeef"),
    "DeleteRunTree": lambda i: pb.DeleteRunTreeRequest(run_id=i["run_id"]),
    "RetentionOverride": lambda i: pb.RetentionOverrideRequest(op="list"),
    "ErasureReport": lambda i: pb.ErasureReportRequest(subject=i["user_id"]),
    "ErasureExecute": lambda i: pb.ErasureExecuteRequest(subject=i["user_id"]),  # a dry run
    "UsageReport": lambda i: pb.UsageReportRequest(group_by=["user"]),
    "TokenLimit": lambda i: pb.TokenLimitRequest(op="list"),
}
# Operator-only RPCs (substrate:admin, as their HTTP routes): a tenant token is refused before any lookup.
ADMIN_ONLY = {"OperatorTokenDef", "PauseRuntime", "ResumeRuntime", "GetRuntimeState"}
ADMIN_ONLY |= {"CreateSnapshot", "ListSnapshots", "GetSnapshot", "ExportSnapshot", "RestoreSnapshot", "DeleteSnapshot"}
# Answers that name no resource: a list that must come back empty (nothing of acme's), and Health.
EMPTY_LISTS = {"ListUserAgents", "ListChannels", "StreamUserRunStates"}
# Streams that never end by themselves: read for OPEN_ENDED_S, what came until then is the answer.
OPEN_ENDED = {"StreamUserRunStates"}
OPEN_ENDED_S = 3.0
OPEN = {"Health"}
# Creates in the caller's own tenant and names no resource (a batch child never joins a session).
CREATES = {"SpawnRunBatch"}
# Answer within the caller's own tenant, where the named run or person holds nothing: OK and empty
# (DeleteRunTree of another tenant's run deletes nothing, as of a missing one; the official client's rule).
# Replies that echo the request's run_id (as for a missing run); nothing else of acme's may show.
ECHOES = {"DeleteRunTree"}
OWN_TENANT = {"DeleteRunTree", "RetentionOverride", "ErasureReport", "ErasureExecute", "UsageReport", "TokenLimit"}


def call(stub: pb_grpc.LoomcycleStub, name: str, request: Any, token: str | None) -> tuple[SC, str, Any]:
    """(code, details, reply) of one call; a stream is read to its end."""
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    method = servicer.SERVICE.methods_by_name[name]
    got: list[Any] = []
    try:
        reply = getattr(stub, name)(request, metadata=metadata, timeout=OPEN_ENDED_S if name in OPEN_ENDED else 20)
        if method.server_streaming:
            got.extend(reply)
            reply = got
        return SC.OK, "", reply
    except grpc.RpcError as exc:
        if name in OPEN_ENDED and exc.code() == SC.DEADLINE_EXCEEDED:
            return SC.OK, "", got  # still open when the probe stopped reading: it answered `got`
        return exc.code(), exc.details() or "", None


def seed(stub: pb_grpc.LoomcycleStub, alice: str) -> Ids:
    """acme's resources: an interactive run parked for input (its session), and an AgentDef."""
    stream = stub.Run(
        pb.RunRequest(agent="chat", segments=segs(f"hello {MARK}"), user_id="acme-user", interactive=True),
        metadata=(("authorization", f"Bearer {alice}"),),
        timeout=60,
    )
    next(stream)
    ids = json.loads(next(stream).error)
    stream.cancel()
    wait_status(ids["run_id"], RunStatus.AWAITING_INPUT, timeout=60)
    body = {
        "op": "create",
        "name": "acme-grpc-agent",
        "overlay": {"description": MARK, "provider": "mock", "model": "mock-generic"},
    }
    created = call(stub, "AgentDef", sub(body), alice)
    assert created[0] == SC.OK and not created[2].is_error, created
    def_id = json.loads(created[2].output_json)["def_id"]
    note = {"op": "set", "scope": "user", "scope_id": "acme-user", "key": "note", "value": MARK}
    assert call(stub, "Memory", sub(note), alice)[0] == SC.OK
    board = "acme-grpc-board"
    channeldef_create(tenant_id="acme", name=board, spec=ChannelSpec(description=MARK))  # as POST /v1/_channels
    post = pb.PublishChannelRequest(channel=board, payload=json.dumps(MARK).encode())
    assert call(stub, "PublishChannel", post, alice)[0] == SC.OK
    volume = call(stub, "VolumeDef", sub({"op": "create", "name": "acme-grpc-vol"}), alice)
    assert volume[0] == SC.OK and not volume[2].is_error, volume
    return {
        **ids,
        "def_id": def_id,
        "user_id": "acme-user",
        "memory_key": "note",
        "channel": board,
        "volume": "acme-grpc-vol",
    }


def fresh_tenant(n: int) -> str:
    return str(
        tokens.token_create(name=f"g{n}", tenant_id=f"gprobe{n}", subject=f"g{n}", scopes=["substrate:tenant"])["token"]
    )


def test_every_served_rpc_is_in_the_matrix() -> None:
    assert set(servicer.served()) == set(PROBES), "a served RPC needs a probe in PROBES"


def test_another_tenants_resources_are_missing_ones_on_every_rpc(
    stub: pb_grpc.LoomcycleStub, people: dict[str, dict[str, str]]
) -> None:
    alice = people["alice"]["authorization"].removeprefix("Bearer ")
    acme = seed(stub, alice)
    problems = []
    for n, name in enumerate(sorted(PROBES)):
        token = fresh_tenant(n)
        ours = call(stub, name, PROBES[name](acme), token)
        missing = call(stub, name, PROBES[name](MISSING), token)
        echoed = name in ECHOES and ours[2] is not None and ours[2].run_id == acme["run_id"]
        if MARK in repr(ours) or (acme["run_id"] in repr(ours[2]) and not echoed):
            problems.append(f"{name}: acme's data in the answer {ours}")
        if ours[0] != missing[0]:
            problems.append(f"{name}: acme's answer {ours[0]} differs from a missing one's {missing[0]}")
        expected = (
            SC.PERMISSION_DENIED
            if name in ADMIN_ONLY
            else SC.OK
            if name in EMPTY_LISTS | OPEN | CREATES | OWN_TENANT
            else SC.NOT_FOUND
        )
        if ours[0] != expected:
            problems.append(f"{name}: {ours[0]} ({ours[1]}), expected {expected}")
        listed = [] if ours[2] is None else getattr(ours[2], "agents", None) or getattr(ours[2], "channels", [])
        if name in EMPTY_LISTS and any(MARK in repr(x) or "acme-grpc" in repr(x) for x in listed):
            problems.append(f"{name}: listed acme's {listed}")
    assert problems == []
    assert Run.objects.filter(id=acme["run_id"]).exists()  # no probe deleted (or erased) acme's run
    # Nothing written through: acme's run still waits for its input, its owner still sees it.
    assert call(stub, "GetRun", PROBES["GetRun"](acme), alice)[2].status == "running"
    wait_status(acme["run_id"], RunStatus.AWAITING_INPUT)


def test_no_token_or_a_wrong_one_is_unauthenticated_and_scopes_are_the_routes(
    stub: pb_grpc.LoomcycleStub, people: dict[str, dict[str, str]]
) -> None:
    bob = people["bob"]["authorization"].removeprefix("Bearer ")  # acme, runs:create + runs:read only
    for name in sorted(PROBES):
        for token in (None, "lct_not-a-token"):
            code, details, _ = call(stub, name, PROBES[name](MISSING), token)
            want = SC.OK if name in OPEN else SC.UNAUTHENTICATED
            assert (name, code) == (name, want), details
    for name in ("AgentDef", "SkillDef", "WebhookDef", *sorted(ADMIN_ONLY)):
        code, details, _ = call(stub, name, PROBES[name](MISSING), bob)
        assert (name, code) == (name, SC.PERMISSION_DENIED) and "insufficient scope" in details
    # Memory as /v1/_memory: a tenant's member may read (GET), not write (PUT).
    assert call(stub, "Memory", PROBES["Memory"](MISSING), bob)[0] == SC.NOT_FOUND
    write = sub({"op": "set", "scope": "user", "scope_id": "acme-user", "key": "k", "value": 1})
    assert call(stub, "Memory", write, bob)[0] == SC.PERMISSION_DENIED
    assert call(stub, "GetRun", PROBES["GetRun"](MISSING), bob)[0] == SC.NOT_FOUND  # runs:read reaches the lookup
