#!/usr/bin/env python
"""Gateway benchmark (`make bench-gateway`): what /v1/chat/completions adds on
top of the provider it calls, measured in one run on one machine.

1. A zero-latency fake OpenAI upstream (asyncio HTTP/1.1 with keep-alive, its
   own process) answers chat.completions with a fixed reply: JSON, or SSE
   chunks when the request says `stream: true` (as our OpenAI driver does).
2. The web process (Daphne, as `manage.py up` runs it) is configured with a
   yaml `providers: {fake: {driver: openai, dialect: compat, base_url: ...}}`
   on the embedded Postgres/Redis (open mode, loopback).
3. The same client (httpx.AsyncClient, CONCURRENCY requests in flight) sends
   REQUESTS non-streamed completions after WARMUP, (a) straight to the fake
   upstream and (b) through /v1/chat/completions (model "fake/fake-model"),
   alternating ROUNDS times; every reply is checked.

Prints requests/s and p50/p99 latency of both, the added p50/p99 (b - a)
against the targets (added p50 <= 5 ms, p99 <= 20 ms) and the web process's
CPU per request, then one machine-readable line. BENCH_GW_PROFILE=1 runs the
web process under cProfile and prints where its time goes.

Knobs (env): BENCH_GW_REQUESTS (3000), BENCH_GW_WARMUP (500),
BENCH_GW_CONCURRENCY (8), BENCH_GW_ROUNDS (2), BENCH_GW_PROFILE (0),
BENCH_GW_SETTINGS (the Django settings module, to measure a variant),
BENCH_GW_WEB_PROCESSES (1: Daphne processes sharing the socket, as
LOOMCYCLE_WEB_PROCESSES does for `manage.py up`).
"""

from __future__ import annotations

import asyncio
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import stack  # noqa: E402

DATA = ROOT / ".loomcycle" / "bench-gateway"
REQUESTS = int(os.environ.get("BENCH_GW_REQUESTS", "3000"))
WARMUP = int(os.environ.get("BENCH_GW_WARMUP", "500"))
CONCURRENCY = int(os.environ.get("BENCH_GW_CONCURRENCY", "8"))
ROUNDS = int(os.environ.get("BENCH_GW_ROUNDS", "2"))
PROFILE = os.environ.get("BENCH_GW_PROFILE", "0") == "1"
WEB_PROCESSES = int(os.environ.get("BENCH_GW_WEB_PROCESSES", "1"))
TARGET_P50_MS, TARGET_P99_MS = 5.0, 20.0
REPLY = "Hello from the fake upstream."

# --- the fake upstream ------------------------------------------------------------------

_CHUNK = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}


def _sse_body() -> bytes:
    chunks = [
        {**_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**_CHUNK, "choices": [{"index": 0, "delta": {"content": REPLY}, "finish_reason": None}]},
        {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**_CHUNK, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}},
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _json_body() -> bytes:
    message = {"role": "assistant", "content": REPLY}
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }
    return json.dumps(body).encode()


def _response(ctype: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nContent-Length: " + str(len(body)).encode()
    return head + b"\r\nConnection: keep-alive\r\n\r\n" + body


class FakeUpstream(asyncio.Protocol):
    """Minimal HTTP/1.1: Content-Length bodies, keep-alive, pipelining-safe."""

    SSE = _response(b"text/event-stream", _sse_body())
    JSON = _response(b"application/json", _json_body())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            streamed = b'"stream":true' in body.replace(b" ", b"")
            self.transport.write(self.SSE if streamed else self.JSON)


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(FakeUpstream, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# --- the measurement ---------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


async def load(url: str, body: dict[str, object], n: int, status: int = 200) -> tuple[float, list[float]]:
    """n requests, CONCURRENCY in flight, on one pooled client; (requests/s, latencies ms).
    Each reply must have `status` and, for a 200, the upstream's text."""
    import httpx

    latencies: list[float] = []
    left = n
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                resp = await client.post(url, json=body)
                latencies.append((time.perf_counter() - t0) * 1000)
                ok = resp.status_code == status
                if ok and status == 200:
                    ok = resp.json()["choices"][0]["message"]["content"] == REPLY
                if not ok:
                    raise SystemExit(f"bad reply from {url}: {resp.status_code} {resp.text[:300]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - t0
    return n / elapsed, latencies


def wait_port(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}; see {DATA}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def spawn(argv: list[str], env: dict[str, str], log: str, fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    out = (DATA / log).open("ab")
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=fds
    )


def setup_database(config: Path) -> None:
    """The bench's start-up (bench/stack.py: embedded services, stopped at exit; Django), migrated."""
    # A load run: the shipped per-tenant cap (256 calls at once, docs/configuration.md) would refuse some of it.
    stack.boot(
        DATA,
        config,
        instant_mock=False,
        DJANGO_SETTINGS_MODULE=os.environ.get("BENCH_GW_SETTINGS", "loomcycle_project.settings"),
    )
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", interactive=False, verbosity=0)
    connection.close()


def report(
    direct: tuple[float, list[float]],
    gateway: tuple[float, list[float]],
    floor: tuple[float, list[float]],
    cpu_ms: float,
) -> None:
    d_rps, d_lat = direct
    g_rps, g_lat = gateway
    f_rps, f_lat = floor
    d50, d99, g50, g99 = pct(d_lat, 0.5), pct(d_lat, 0.99), pct(g_lat, 0.5), pct(g_lat, 0.99)
    add50, add99 = g50 - d50, g99 - d99
    print(f"direct   {d_rps:8.0f} req/s  p50 {d50:6.2f} ms  p99 {d99:6.2f} ms  ({len(d_lat)} requests)")
    print(f"gateway  {g_rps:8.0f} req/s  p50 {g50:6.2f} ms  p99 {g99:6.2f} ms  ({len(g_lat)} requests)")
    print(
        f"floor    {f_rps:8.0f} req/s  p50 {pct(f_lat, 0.5):6.2f} ms  p99 {pct(f_lat, 0.99):6.2f} ms  "
        "(the same route refused with 400 after auth and parsing: Daphne + Django + ninja + auth, no provider)"
    )
    print(f"ratio    gateway/direct throughput {g_rps / d_rps:.2f}; latency p50 x{g50 / d50:.1f}, p99 x{g99 / d99:.1f}")
    ok50 = "ok" if add50 <= TARGET_P50_MS else "MISSED"
    ok99 = "ok" if add99 <= TARGET_P99_MS else "MISSED"
    print(f"added    p50 {add50:.2f} ms (target <= {TARGET_P50_MS:.0f} ms: {ok50}), ", end="")
    print(f"p99 {add99:.2f} ms (target <= {TARGET_P99_MS:.0f} ms: {ok99})")
    print(f"web      {cpu_ms:.2f} ms CPU per gateway request (Daphne process)")
    print(
        f"gateway_rps={g_rps:.1f} direct_rps={d_rps:.1f} added_p50_ms={add50:.2f} added_p99_ms={add99:.2f}",
        flush=True,
    )


def print_profile(path: Path) -> None:
    if not path.exists():
        print("(no profile written)")
        return
    print("\nweb process profile (top 25 by own time):")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    up_port, web_port = free_port(), free_port()
    config = Path(tempfile.mkdtemp(prefix="lc-bench-gw-")) / "gateway.yaml"
    provider = {"driver": "openai", "dialect": "compat", "base_url": f"http://127.0.0.1:{up_port}/v1"}
    config.write_text(json.dumps({"providers": {"fake": provider}}))  # JSON is YAML
    setup_database(config)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    import psutil

    profile = DATA / "web.prof"
    profile.unlink(missing_ok=True)
    upstream = spawn([sys.executable, __file__, "--upstream", str(up_port)], env, "upstream.log")
    if WEB_PROCESSES > 1:  # as `manage.py up` with LOOMCYCLE_WEB_PROCESSES: one socket, several Daphnes
        from loomcycle_project.management.commands.up import listen_socket

        sock = listen_socket("127.0.0.1", web_port)
        fd = sock.fileno()
        argv = [sys.executable, "-m", "daphne", "--fd", str(fd), "loomcycle_project.asgi:application"]
        webs = [spawn(argv, env, f"web{i}.log", (fd,)) for i in range(WEB_PROCESSES)]
    else:
        daphne = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "loomcycle_project.asgi:application"]
        web_argv = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if PROFILE else []), *daphne]
        webs = [spawn(web_argv, env, "web.log")]
    web = webs[0]
    try:
        wait_port(f"http://127.0.0.1:{up_port}/", upstream)
        wait_port(f"http://127.0.0.1:{web_port}/healthz", web)
        direct_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
        gateway_url = f"http://127.0.0.1:{web_port}/v1/chat/completions"
        messages = [{"role": "user", "content": "hi"}]
        direct_body = {"model": "fake-model", "messages": messages, "max_tokens": 16}
        gateway_body = {**direct_body, "model": "fake/fake-model"}
        print(
            f"loomcycle gateway bench: {os.cpu_count()} cores; {ROUNDS} x {REQUESTS} requests each way after "
            f"{WARMUP} warm-up, {CONCURRENCY} in flight, one httpx.AsyncClient, {WEB_PROCESSES} web process(es)",
            flush=True,
        )
        asyncio.run(load(direct_url, direct_body, WARMUP))
        asyncio.run(load(gateway_url, gateway_body, WARMUP))
        web_procs = [psutil.Process(w.pid) for w in webs]
        d_lat: list[float] = []
        g_lat: list[float] = []
        f_lat: list[float] = []
        d_time = g_time = f_time = cpu = 0.0
        for _ in range(ROUNDS):
            rps, lat = asyncio.run(load(direct_url, direct_body, REQUESTS))
            d_lat += lat
            d_time += REQUESTS / rps
            cpu0 = sum(sum(w.cpu_times()[:2]) for w in web_procs)
            rps, lat = asyncio.run(load(gateway_url, gateway_body, REQUESTS))
            cpu += sum(sum(w.cpu_times()[:2]) for w in web_procs) - cpu0
            g_lat += lat
            g_time += REQUESTS / rps
            rps, lat = asyncio.run(load(gateway_url, {**gateway_body, "n": 2}, REQUESTS, status=400))
            f_lat += lat
            f_time += REQUESTS / rps
        n = ROUNDS * REQUESTS
        report((n / d_time, d_lat), (n / g_time, g_lat), (n / f_time, f_lat), cpu * 1000 / n)
    finally:
        for w in webs:
            stop(w)
        stop(upstream)
    if PROFILE:
        print_profile(profile)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--upstream":
        asyncio.run(_serve(int(sys.argv[2])))
    else:
        main()
