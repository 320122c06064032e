"""The gRPC tests: a real `manage.py grpc` process on loopback against the test database,
started and stopped here; driven with stubs generated from the project's .proto (made here
when missing or older than the .proto, as `make test` does through `make proto`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apps.grpcapi import stubs
from tests import procs

if stubs.stale():
    stubs.generate()

from grpc_health.v1 import health_pb2, health_pb2_grpc

from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc


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


@pytest.fixture(scope="module")
def grpc_target(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """`manage.py grpc` on a free loopback port; its `host:port`."""
    port = procs.free_port()
    target = f"127.0.0.1:{port}"
    argv = [sys.executable, "manage.py", "grpc", "--addr", target]
    proc = procs.spawn(argv, stack_env, logdir / "grpc.log")
    try:
        wait_serving(target)
        yield target
    finally:
        procs.stop(proc)


@pytest.fixture
def stub(grpc_target: str) -> Iterator[pb_grpc.LoomcycleStub]:
    with grpc.insecure_channel(grpc_target) as channel:
        yield pb_grpc.LoomcycleStub(channel)
