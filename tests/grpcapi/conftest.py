"""The gRPC tests: a real `manage.py grpc` process on loopback against the test database,
started and stopped here; driven with stubs generated from the project's .proto (made here
when missing or older than the .proto, as `make test` does through `make proto`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apps.grpcapi import stubs

if stubs.stale():
    stubs.generate()

from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from tests.factories.grpc import grpc_server


@pytest.fixture(scope="module")
def grpc_target(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """`manage.py grpc` on a loopback port the kernel picks; its `host:port`."""
    with grpc_server(stack_env, logdir / "grpc.log") as target:
        yield target


@pytest.fixture
def stub(grpc_target: str) -> Iterator[pb_grpc.LoomcycleStub]:
    with grpc.insecure_channel(grpc_target) as channel:
        yield pb_grpc.LoomcycleStub(channel)
