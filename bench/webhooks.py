#!/usr/bin/env python
"""Webhook receiver benchmark (`make bench-webhooks`): deliveries accepted per
second end to end (signature check to run row committed: the 202 is sent
after the commit) and the latency a delivery adds, measured in one run.

1. The embedded Postgres/Redis of .loomcycle/bench-webhooks, the bundled
   loomcycle.yaml (agent `echo`), one WebhookDef (hmac, delivery id header,
   a rate limit too high to bind) and BENCH_WH_WEB_PROCESSES Daphne processes
   with the receiver mounted. No workers: the runs stay queued, so what is
   measured is the receiver, not the engine.
2. The same client (httpx.AsyncClient, BENCH_WH_CONCURRENCY in flight) sends
   BENCH_WH_DELIVERIES signed deliveries with distinct ids after a warm-up;
   every answer must be 202 with a run id.
3. The floor: as many deliveries to an unknown webhook (404 `unknown_webhook`:
   Daphne, Django, the definition lookup and the rejection record), on the
   same client. Added latency = accepted - floor, per percentile: what
   verify, dedupe, mapping, the rate-limit script and the run's transaction add.

Prints deliveries/s and p50/p99 of both, the added p50/p99, the host's CPU
steal during each phase (bench/stack.host_steal_pct), then one
machine-readable line. No target is enforced.

Knobs (env): BENCH_WH_DELIVERIES (2000), BENCH_WH_WARMUP (200),
BENCH_WH_CONCURRENCY (16), BENCH_WH_WEB_PROCESSES (1).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench-webhooks"
DELIVERIES = int(os.environ.get("BENCH_WH_DELIVERIES", "2000"))
WARMUP = int(os.environ.get("BENCH_WH_WARMUP", "200"))
CONCURRENCY = int(os.environ.get("BENCH_WH_CONCURRENCY", "16"))
WEB_PROCESSES = int(os.environ.get("BENCH_WH_WEB_PROCESSES", "1"))
SECRET = "bench-webhook-secret"
HOOK = "bench"

from bench import stack  # noqa: E402

stack.boot(
    DATA,
    instant_mock=False,
    LOOMCYCLE_WEBHOOKS_ENABLED="1",
    LOOMCYCLE_BENCH_WEBHOOK_SECRET=SECRET,
)
from bench.stack import host_steal_pct, pct, stop_all  # noqa: E402


def setup() -> None:
    """Migrate, load the yaml agents, (re)define the bench webhook, drop old doorbells."""
    from django.core.management import call_command
    from django.db import connection

    from apps.core.redis import sync_client
    from apps.substrate.kinds import get_kind
    from apps.substrate.services import Author, def_dispatch
    from loomcycle_project.bootstrap import load_yaml_config

    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    overlay = {
        "agent": "echo",
        "auth": {"signing_secret_env": "LOOMCYCLE_BENCH_WEBHOOK_SECRET", "delivery_id_header": "X-Delivery"},
        "rate_limit": {"requests_per_minute": 10_000_000, "burst": 1_000_000},
    }
    ops = Author(tenant_id="", subject="bench", is_admin=True, agent_id="a_bench")
    def_dispatch(get_kind("webhook"), ops, {"op": "create", "name": HOOK, "overlay": overlay})
    sync_client().flushdb()  # this data dir's own Redis: queued doorbells of earlier bench runs go
    connection.close()


def start_webs() -> tuple[list[subprocess.Popen[bytes]], str]:
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    fd, port = sock.fileno(), sock.getsockname()[1]
    os.set_inheritable(fd, True)
    argv = [sys.executable, "-m", "daphne", "--fd", str(fd), "loomcycle_project.asgi:application"]
    webs = []
    for i in range(WEB_PROCESSES):
        out = (DATA / f"web{i}.log").open("ab")
        webs.append(
            subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT, pass_fds=(fd,))
        )
    return webs, f"http://127.0.0.1:{port}"


def wait_up(base: str) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{base} did not answer within 60 s; see {DATA}/web*.log")


def signed(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"event": "bench", "n": n}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {"X-Hub-Signature-256": signature, "X-Delivery": f"{uuid.uuid4().hex}-{n}"}


async def load(url: str, n: int, status: int) -> tuple[float, list[float]]:
    """n signed deliveries, CONCURRENCY in flight; (deliveries/s, latencies ms). Each must answer `status`."""
    import httpx

    latencies: list[float] = []
    left = n
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                body, headers = signed(left)
                t0 = time.perf_counter()
                resp = await client.post(url, content=body, headers=headers)
                latencies.append((time.perf_counter() - t0) * 1000)
                if resp.status_code != status or (status == 202 and not resp.json().get("run_id")):
                    raise SystemExit(f"bad answer from {url}: {resp.status_code} {resp.text[:300]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return n / (time.perf_counter() - t0), latencies


def phase(url: str, n: int, status: int) -> tuple[float, list[float], float]:
    before = psutil.cpu_times()
    rate, latencies = asyncio.run(load(url, n, status))
    return rate, latencies, host_steal_pct(before, psutil.cpu_times())


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    setup()
    webs, base = start_webs()
    try:
        wait_up(base)
        accepted_url, floor_url = f"{base}/v1/_webhooks/{HOOK}", f"{base}/v1/_webhooks/no-such-{HOOK}"
        asyncio.run(load(accepted_url, WARMUP, 202))
        asyncio.run(load(floor_url, WARMUP, 404))
        a_rate, a_lat, a_steal = phase(accepted_url, DELIVERIES, 202)
        f_rate, f_lat, f_steal = phase(floor_url, DELIVERIES, 404)
    finally:
        stop_all(webs)
    a50, a99, f50, f99 = pct(a_lat, 0.5), pct(a_lat, 0.99), pct(f_lat, 0.5), pct(f_lat, 0.99)
    load1 = os.getloadavg()[0]
    print(f"{DELIVERIES} deliveries, {CONCURRENCY} in flight, {WEB_PROCESSES} web process(es), {WARMUP} warm-up")
    print(f"host     {psutil.cpu_count()} CPUs, load average {load1:.1f} at the end (other processes share the host)")
    print(f"accepted {a_rate:8.0f} deliveries/s  p50 {a50:6.2f} ms  p99 {a99:6.2f} ms  (host steal {a_steal:.0f} %)")
    print(f"floor    {f_rate:8.0f} deliveries/s  p50 {f50:6.2f} ms  p99 {f99:6.2f} ms  (host steal {f_steal:.0f} %)")
    print(f"added    p50 {a50 - f50:.2f} ms, p99 {a99 - f99:.2f} ms (accepted - floor)")
    print(
        f"webhook_accepted_per_s={a_rate:.1f} added_p50_ms={a50 - f50:.2f} added_p99_ms={a99 - f99:.2f} "
        f"steal_pct={a_steal:.0f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
