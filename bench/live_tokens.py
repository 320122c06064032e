#!/usr/bin/env python
"""Live tokens (`make bench-live`, and a phase of `make bench`): how long a model's text takes from
the provider to an SSE client, at 1 and at BENCH_LIVE_RUNS concurrent streaming runs.

Each run (the `streaming` agent, bench/agents.yaml) plays a mock-script reply of BENCH_LIVE_WORDS
words, one word (8 characters, ending in a space, so nothing is held back) per piece, BENCH_LIVE_CHUNK_MS
apart; the mock records each piece's send time in Redis (apps.gateway.providers.mock_chunks). The
clients (one asyncio loop, POST /v1/runs SSE against one Daphne, two workers) note when each byte
of text arrives. Measured, on one clock (this host's):
- chunk -> client: a piece's send time to the arrival of the frame that completes it, p50/p99;
- runtime's added time to first token: (first text at the client - request sent) minus
  (first piece - the mock's stream start), p50/p99;
- CPU per streamed piece of the workers, the web process and Redis, and write commits (xids)
  per iteration, over the concurrent phase; the host's steal over each phase.
Every client's text is checked against its run's committed text.

Knobs (env): BENCH_LIVE_RUNS (100), BENCH_LIVE_WORDS (50), BENCH_LIVE_CHUNK_MS (20),
BENCH_WORKERS (2), BENCH_CONCURRENCY (64). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench-live"
RUNS = int(os.environ.get("BENCH_LIVE_RUNS", "100"))
WORDS = int(os.environ.get("BENCH_LIVE_WORDS", "50"))
CHUNK_MS = int(os.environ.get("BENCH_LIVE_CHUNK_MS", "20"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))

from bench import stack  # noqa: E402

SERVICES = stack.boot(DATA, stack.BENCH / "agents.yaml", LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL=str(max(64, RUNS * 2)))
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.redis import sync_client  # noqa: E402
from apps.gateway.providers.mock_chunks import sent_key  # noqa: E402
from apps.runs.models import RunEvent  # noqa: E402
from bench.stack import cpu_s, host_steal_pct, pct, service_pids, stop_all  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402


def reply(n: int) -> str:
    return "".join(f"w{n:03d}{i:03d} " for i in range(WORDS))  # 8 characters a word


async def stream(client: httpx.AsyncClient, n: int) -> dict[str, Any]:
    """One run through POST /v1/runs: its id, when the request left, and (arrival, characters so far)."""
    script = [{"text": reply(n), "chunk_chars": 8, "chunk_ms": CHUNK_MS}]
    body = {"agent": "streaming", "prompt": "MOCK_SCRIPT: " + json.dumps(script)}
    sent_at, run_id, chars, arrivals = time.time(), "", 0, []
    async with client.stream("POST", "/v1/runs", json=body) as resp:
        resp.raise_for_status()
        event = ""
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "agent":
                run_id = json.loads(line[6:])["run_id"]
            elif line.startswith("data: ") and event == "text":
                chars += len(json.loads(line[6:])["text"])
                arrivals.append((time.time(), chars))
    return {"run_id": run_id, "sent_at": sent_at, "arrivals": arrivals, "chars": chars}


async def clients(base: str, n: int) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        return list(await asyncio.gather(*(stream(client, i) for i in range(n))))


def measure(result: dict[str, Any]) -> tuple[list[float], float]:
    """The run's chunk -> client latencies (ms) and the runtime's added time to first token (ms)."""
    raw = [v.decode().split() for v in sync_client().lrange(sent_key(result["run_id"]), 0, -1)]
    start = next(float(t) for t, c in raw if c == "0")
    pieces = [(float(t), int(c)) for t, c in raw if int(c) > 0]
    latencies = []
    for at, chars in pieces:
        arrival = next(t for t, have in result["arrivals"] if have >= chars)
        latencies.append((arrival - at) * 1000)
    client_ttft = result["arrivals"][0][0] - result["sent_at"]
    provider_ttft = pieces[0][0] - start
    return latencies, (client_ttft - provider_ttft) * 1000


def check(results: list[dict[str, Any]]) -> None:
    for r in results:
        texts = RunEvent.objects.filter(run_id=r["run_id"], type="text").values_list("payload", flat=True)
        committed = "".join(p["text"] for p in texts)
        if r["chars"] != len(committed) or len(committed) != WORDS * 8:
            raise SystemExit(f"run {r['run_id']}: the client got {r['chars']} characters, {len(committed)} committed")
    connection.close()


def xid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        return int(cur.fetchone()[0])


def phase(base: str, n: int, groups: dict[str, list[int]]) -> dict[str, float]:
    cpu0, host0, xid0 = {k: cpu_s(v) for k, v in groups.items()}, psutil.cpu_times(), xid()
    results = asyncio.run(clients(base, n))
    cpu1, steal, xid1 = {k: cpu_s(v) for k, v in groups.items()}, host_steal_pct(host0, psutil.cpu_times()), xid()
    check(results)
    latencies, added = [], []
    for r in results:
        lat, ttft = measure(r)
        latencies += lat
        added.append(ttft)
    pieces = n * WORDS
    out = {
        "runs": n,
        "p50_chunk_ms": pct(latencies, 0.5),
        "p99_chunk_ms": pct(latencies, 0.99),
        "p50_added_ttft_ms": pct(added, 0.5),
        "p99_added_ttft_ms": pct(added, 0.99),
        "commits_per_iteration": (xid1 - xid0 - n - 1) / n,  # one iteration a run; minus creations and a probe
        "steal_pct": steal,
    }
    for k in cpu0:
        out[f"cpu_us_per_piece_{k}"] = (cpu1[k] - cpu0[k]) * 1e6 / pieces
    return out


def start_web(env: dict[str, str]) -> tuple[Any, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "loomcycle_project.asgi:application"]
    proc = stack.spawn(argv, env, DATA / "web.log")
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.3)
    stop_all([proc])
    raise SystemExit(f"the web process did not come up; see {DATA}/web.log")


def report(r: dict[str, float]) -> None:
    print(
        f"{r['runs']:>3} streaming runs: chunk -> client "
        f"p50 {r['p50_chunk_ms']:.1f} ms, p99 {r['p99_chunk_ms']:.1f} ms; "
        f"added TTFT p50 {r['p50_added_ttft_ms']:.0f} ms, p99 {r['p99_added_ttft_ms']:.0f} ms; "
        f"{r['commits_per_iteration']:.2f} write commits/iteration; host steal {r['steal_pct']:.0f} %",
        flush=True,
    )
    cpu = ", ".join(f"{k[len('cpu_us_per_piece_') :]} {v:.0f}" for k, v in r.items() if k.startswith("cpu_us"))
    print(f"    cpu us per streamed piece: {cpu}", flush=True)


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="live",
        count=WORKERS,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )
    web, base = start_web(env)
    try:
        print(
            f"loomcycle live-token bench: {os.cpu_count()} cores, {WORKERS} workers x {CONCURRENCY} threads, 1 web; "
            f"{WORDS} pieces a reply, {CHUNK_MS} ms apart",
            flush=True,
        )
        groups = {"worker": [p.pid for p in workers], "web": [web.pid], "redis": service_pids()["redis"]}
        asyncio.run(clients(base, 4))  # warm-up: connections, pools, caches
        results = [phase(base, 1, groups), phase(base, RUNS, groups)]
    finally:
        stop_all([web, *workers])
    for r in results:
        report(r)
    last = results[-1]
    print("live_tokens " + " ".join(f"{k}={v:.2f}" for k, v in last.items()), flush=True)


if __name__ == "__main__":
    main()
