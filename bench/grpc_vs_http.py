#!/usr/bin/env python
"""gRPC against HTTP (`make bench-grpc`), in one run on one machine, on the stack `make run`
starts (`manage.py up` with LOOMCYCLE_GRPC_ADDR, the embedded Postgres/Redis under
.loomcycle/bench-grpc, open mode on loopback, the instant mock):

1. a unary read: GetRun over gRPC (one channel) and GET /v1/runs/{id} over HTTP (one
   keep-alive connection), REQUESTS sequential calls each after WARMUP, alternated ROUNDS times;
2. time to first event of a streamed run: Run over gRPC and POST /v1/runs (SSE) over HTTP,
   from the request until the run's first event (`started`, after the registration frames),
   STREAMS runs each, alternated.

Prints p50/p99 of each and gRPC minus HTTP, then one machine-readable line.
Knobs (env): BENCH_GRPC_REQUESTS (500), BENCH_GRPC_WARMUP (100), BENCH_GRPC_STREAMS (40),
BENCH_GRPC_ROUNDS (2)."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench-grpc"
REQUESTS = int(os.environ.get("BENCH_GRPC_REQUESTS", "500"))
WARMUP = int(os.environ.get("BENCH_GRPC_WARMUP", "100"))
STREAMS = int(os.environ.get("BENCH_GRPC_STREAMS", "40"))
ROUNDS = int(os.environ.get("BENCH_GRPC_ROUNDS", "2"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(web: int, grpc_port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {
        "LOOMCYCLE_DATA_DIR": str(DATA),
        "LOOMCYCLE_LISTEN_ADDR": f"127.0.0.1:{web}",
        "LOOMCYCLE_GRPC_ADDR": f"127.0.0.1:{grpc_port}",
        "LOOMCYCLE_FLOWER_ENABLED": "0",
        "LOOMCYCLE_LOG_LEVEL": "WARNING",
    }
    DATA.mkdir(parents=True, exist_ok=True)
    log = (DATA / "up.log").open("ab")
    argv = [sys.executable, "manage.py", "up"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_up(base: str, target: str) -> None:
    from tests.factories.grpc import wait_serving

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    wait_serving(target, timeout=120)


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def first_event_http(http: httpx.Client) -> float:
    t0 = time.perf_counter()
    with http.stream("POST", "/v1/runs", json={"agent": "echo", "prompt": "hi"}) as resp:
        lines = resp.iter_lines()
        for line in lines:
            if line == "event: started":
                ms = (time.perf_counter() - t0) * 1000
                break
        for _ in lines:  # read to the end: the run's stream closes after `done`
            pass
    return ms


def main() -> None:
    from apps.grpcapi.proto import loomcycle_pb2 as pb
    from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc

    web, gport = free_port(), free_port()
    base, target = f"http://127.0.0.1:{web}", f"127.0.0.1:{gport}"
    proc = start(web, gport)
    try:
        wait_up(base, target)
        segments = [pb.PromptSegment(role="user", content=[pb.PromptContentBlock(type="trusted-text", text="hi")])]
        with httpx.Client(base_url=base, timeout=30) as http, grpc.insecure_channel(target) as channel:
            stub = pb_grpc.LoomcycleStub(channel)

            def first_event_grpc() -> float:
                t0 = time.perf_counter()
                stream = stub.Run(pb.RunRequest(agent="echo", segments=segments), timeout=60)
                for event in stream:
                    if event.type == "started":
                        ms = (time.perf_counter() - t0) * 1000
                        break
                for _ in stream:
                    pass
                return ms

            events = list(stub.Run(pb.RunRequest(agent="echo", segments=segments), timeout=60))
            run_id = json.loads(events[1].error)["run_id"]
            unary = {"grpc": [], "http": []}  # type: dict[str, list[float]]
            ttfe = {"grpc": [], "http": []}  # type: dict[str, list[float]]
            get_grpc = lambda: stub.GetRun(pb.GetRunRequest(run_id=run_id), timeout=10)  # noqa: E731
            get_http = lambda: http.get(f"/v1/runs/{run_id}").raise_for_status()  # noqa: E731
            timed(get_grpc, WARMUP), timed(get_http, WARMUP)
            for _ in range(ROUNDS):
                unary["grpc"] += timed(get_grpc, REQUESTS)
                unary["http"] += timed(get_http, REQUESTS)
                ttfe["grpc"] += [first_event_grpc() for _ in range(STREAMS)]
                ttfe["http"] += [first_event_http(http) for _ in range(STREAMS)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    report(unary, ttfe)


def report(unary: dict[str, list[float]], ttfe: dict[str, list[float]]) -> None:
    line = {}
    for what, data in (("GetRun vs GET /v1/runs/{id}", unary), ("time to first event, Run vs POST /v1/runs", ttfe)):
        g50, g99, h50, h99 = (
            pct(data["grpc"], 0.5),
            pct(data["grpc"], 0.99),
            pct(data["http"], 0.5),
            pct(data["http"], 0.99),
        )
        print(f"{what}: gRPC p50 {g50:.2f} ms p99 {g99:.2f} ms | HTTP p50 {h50:.2f} ms p99 {h99:.2f} ms "
              f"| gRPC - HTTP p50 {g50 - h50:+.2f} ms (n={len(data['grpc'])} each, mean gRPC "
              f"{statistics.fmean(data['grpc']):.2f} ms)")  # fmt: skip
        key = "unary" if data is unary else "ttfe"
        line[key] = {"grpc_p50": g50, "grpc_p99": g99, "http_p50": h50, "http_p99": h99}
    print(json.dumps({"bench": "grpc", **line}))


if __name__ == "__main__":
    main()
