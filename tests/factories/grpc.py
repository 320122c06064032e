"""Shapes the gRPC tests share: the project's stubs' segments, a `manage.py grpc` process on a port
the kernel picks, and waiting for a gRPC server to serve (tests/grpcapi, tests/core/test_up.py,
bench/grpc_vs_http.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apps.grpcapi import stubs
from tests import procs

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


# What `manage.py grpc` logs once it listens (apps.grpcapi.server.serve).
_LISTENING = re.compile(rb"gRPC: loomcycle\.v1\.Loomcycle on \S+ \(port (\d+)\)")


@contextmanager
def grpc_server(env: dict[str, str], log: Path, timeout: float = 60.0) -> Iterator[str]:
    """`manage.py grpc` on a loopback port the kernel picks (`:0`), read back from what the process
    logs; its `host:port` once SERVING. A port picked here and bound by the process later could be
    bound meanwhile by another test process's server: the kernel's pick cannot."""
    start = log.stat().st_size if log.exists() else 0  # the log is shared: read this process's lines
    proc = procs.spawn([sys.executable, "manage.py", "grpc", "--addr", "127.0.0.1:0"], env, log)
    try:
        target = f"127.0.0.1:{_listening_port(proc, log, start, time.monotonic() + timeout)}"
        wait_serving(target, timeout)
        yield target
    finally:
        procs.stop(proc)


def _listening_port(proc: subprocess.Popen[bytes], log: Path, start: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        with log.open("rb") as lines:
            lines.seek(start)
            found = _LISTENING.search(lines.read())
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"manage.py grpc exited ({proc.returncode}) before listening: see {log}")
        time.sleep(0.1)
    raise TimeoutError(f"manage.py grpc did not listen within its timeout: see {log}")
