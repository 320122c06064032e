"""The gRPC server's own surface: every RPC of loomcycle.v1 served or UNIMPLEMENTED with its
reason, grpc.health.v1 and reflection for grpcurl and load balancers, the message-size limit
as a status (the server and the connection go on), the container healthcheck."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from apps.grpcapi import servicer, unserved
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.grpcapi.server import build, options
from tests.procs import ROOT, free_port

SERVED = {
    "SpawnRunBatch", "VolumeDef", "CancelTurn", "CompactRun", "ReplaySession", "ResolveInterrupt", "Memory",
    "ListChannels", "PublishChannel", "SubscribeChannel", "PeekChannel", "AckChannel", "AwaitChannels",
    "BroadcastChannels",
    "Health", "Run", "Continue", "StreamRun", "GetRun", "GetAgent", "CancelAgent", "RunInput", "GetTranscript",
    "ListUserAgents", "PauseRuntime", "ResumeRuntime", "GetRuntimeState", "ListChildRuns", "StreamUserRunStates",
    "AgentDef", "SkillDef", "MCPServerDef", "ScheduleDef", "WebhookDef", "OperatorTokenDef", "A2AServerCardDef",
    "A2AAgentDef",
    "CreateSnapshot", "ListSnapshots", "GetSnapshot", "ExportSnapshot", "RestoreSnapshot", "DeleteSnapshot",
    "DeleteRunTree", "ErasureReport", "ErasureExecute", "RetentionOverride", "TokenLimit", "UsageReport",
}  # fmt: skip


def test_every_rpc_is_served_or_named_unserved_with_a_reason() -> None:
    names = {m.name for m in servicer.SERVICE.methods}
    assert set(servicer.served()) == SERVED
    assert names == SERVED | set(unserved.UNSERVED) and not SERVED & set(unserved.UNSERVED)
    compat = (ROOT / "docs" / "compat.md").read_text()
    missing = [name for name in unserved.UNSERVED if f"`{name}`" not in compat]
    assert missing == [], "docs/compat.md must list every unserved RPC"


def _unary_unserved(stub: pb_grpc.LoomcycleStub, name: str) -> grpc.RpcError:
    method = servicer.SERVICE.methods_by_name[name]
    request = pb.DESCRIPTOR.message_types_by_name[method.input_type.name]._concrete_class()
    call = getattr(stub, name)
    with pytest.raises(grpc.RpcError) as info:
        result = call(request, timeout=10)
        if method.server_streaming:
            list(result)
    return info.value


@pytest.mark.usefixtures("transactional_db")
def test_unserved_rpcs_answer_unimplemented_naming_themselves(stub: pb_grpc.LoomcycleStub) -> None:
    for name in ("Decide", "StartConfiguredRun", "TeamDef", "History"):
        err = _unary_unserved(stub, name)
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED, name
        assert err.details() == unserved.message(name) and f"/{name}:" in err.details()
    assert "does not have this capability" in _unary_unserved(stub, "Decide").details()
    assert "not serve it over gRPC yet" in _unary_unserved(stub, "HookDef").details()


def test_health_and_reflection_serve_grpcurl_and_load_balancers(grpc_target: str) -> None:
    with grpc.insecure_channel(grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "loomcycle.v1.Loomcycle"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        listed = next(iter(reflect.ServerReflectionInfo(iter([ask]), timeout=10)))
        names = {s.name for s in listed.list_services_response.service}
        assert {"loomcycle.v1.Loomcycle", "grpc.health.v1.Health"} <= names
        ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol="loomcycle.v1.Loomcycle")
        found = next(iter(reflect.ServerReflectionInfo(iter([ask]), timeout=10)))
        assert found.file_descriptor_response.file_descriptor_proto  # grpcurl describes it from this


def test_an_oversized_message_is_resource_exhausted_and_the_server_goes_on(
    grpc_target: str, stub: pb_grpc.LoomcycleStub
) -> None:
    limit = dict(options())["grpc.max_receive_message_length"]
    huge = pb.RunRequest(agent="echo", segments=[pb.PromptSegment(role="user", content=[
        pb.PromptContentBlock(type="trusted-text", text="x" * (limit + 1))])])  # fmt: skip
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Run(huge, timeout=30))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.Health(pb.HealthRequest(), timeout=10).ok  # same channel, same server: still serving


def test_keepalive_and_limits_come_from_settings(settings: object) -> None:
    opts = dict(options())
    assert opts["grpc.max_receive_message_length"] == 16 * 1024 * 1024
    assert opts["grpc.max_send_message_length"] == 64 * 1024 * 1024
    assert opts["grpc.keepalive_time_ms"] == 30_000 and opts["grpc.keepalive_timeout_ms"] == 10_000
    assert opts["grpc.http2.min_recv_ping_interval_without_data_ms"] == 10_000


def test_a_second_server_on_a_port_in_use_fails_to_listen_instead_of_sharing_it() -> None:
    async def two_on_one_port() -> None:
        first, port, _ = await build("127.0.0.1:0")
        await first.start()
        try:
            with pytest.raises((OSError, RuntimeError)):
                await build(f"127.0.0.1:{port}")
        finally:
            await first.stop(None)

    asyncio.run(two_on_one_port())


def test_the_container_healthcheck_asks_grpc_health(grpc_target: str, stack_env: dict[str, str]) -> None:
    argv = [sys.executable, "-m", "loomcycle_project.healthcheck", "grpc", "--url", grpc_target]
    done = subprocess.run(argv, env=stack_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"{grpc_target}: SERVING"), done.stderr
    nobody = f"127.0.0.1:{free_port()}"
    argv[-1] = nobody
    done = subprocess.run(argv, env=stack_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith(f"unhealthy: {nobody}: UNAVAILABLE")
