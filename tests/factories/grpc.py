"""Shapes the gRPC tests share: the project's stubs' segments, and waiting for a gRPC server to
serve (tests/grpcapi, tests/core/test_up.py, bench/grpc_vs_http.py)."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apps.grpcapi import stubs

if stubs.stale():  # what `make test` does through `make proto`, for a bare pytest run
    stubs.generate()

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc


def grpc_stub(channel: grpc.Channel) -> pb_grpc.LoomcycleStub:
    """The project's stub of loomcycle.v1.Loomcycle on `channel`."""
    return pb_grpc.LoomcycleStub(channel)  # type: ignore[no-untyped-call]


def user_text(text: str) -> list[pb.PromptSegment]:
    """One user segment with one trusted-text block (loomcycle's nested shape)."""
    return [pb.PromptSegment(role="user", content=[pb.PromptContentBlock(type="trusted-text", text=text)])]


def wait_serving(target: str, timeout: float = 60.0) -> None:
    """Until grpc.health.v1 says SERVING for loomcycle.v1.Loomcycle."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service="loomcycle.v1.Loomcycle"), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:  # not listening yet: retried until the deadline, then reported
                last = exc
            time.sleep(0.1)
    raise TimeoutError(f"gRPC on {target} was not SERVING within {timeout} s (last error: {last})")
