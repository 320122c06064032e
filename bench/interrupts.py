#!/usr/bin/env python
"""Interruption park/resolve round trip (`make bench-interrupts`).

N runs of the `asking` agent (bench/agents.yaml) each make one Interruption
ask. Measured, from Postgres's own timestamps (one clock):
- park: run created -> the step that parked it committed (`created_at` ->
  `updated_at` while `awaiting_interrupt`): the first iteration, the ask, the
  row and the event in one commit;
- resolve: the answer committed (the interrupt's `resolved_at`, stamped in the
  resolve's transaction) -> the run completed (`completed_at`): the doorbell,
  one worker claim, the model turn after the answer, the final commit.
Resolves go through the service the REST route and the admin call
(apps.runs.interrupts.services.interrupt_resolve), BENCH_INT_RESOLVERS at a time, once
every run is parked; HTTP is not in the figure. Prints p50/p99/max of both,
the parked runs' worker RSS, and the host's CPU steal.

Knobs (env): BENCH_INTERRUPTS (200), BENCH_INT_RESOLVERS (8), BENCH_WORKERS (2),
BENCH_CONCURRENCY (16). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench"
N = int(os.environ.get("BENCH_INTERRUPTS", "200"))
RESOLVERS = int(os.environ.get("BENCH_INT_RESOLVERS", "8"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
SCRIPT = [{"tool": "Interruption", "input": {"op": "ask", "question": "ok?", "options": ["yes", "no"]}}, {"text": "ok"}]

from bench import stack  # noqa: E402

SERVICES = stack.boot(DATA, stack.BENCH / "agents.yaml")
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.core.types import Principal  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.interrupts import services as interrupts  # noqa: E402
from apps.runs.models import Interrupt, Run, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from bench import stack  # noqa: E402
from bench.stack import pct, stop_all  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

OPS = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))


def create(n: int) -> list[str]:
    prompt = "MOCK_SCRIPT: " + json.dumps(SCRIPT)
    data = services.RunCreate(agent="asking", segments=[Segment(text=prompt)], user_id="bench")
    return [services.run_create(principal=OPS, data=data).id for _ in range(n)]


def wait_all(ids: list[str], status: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Run.objects.filter(id__in=ids, status=status).count() >= len(ids):
            return
        time.sleep(0.2)
    raise SystemExit(f"not every run reached {status} within {timeout} s; see {DATA}/*.log")


def resolve(interrupt: tuple[str, str]) -> None:
    interrupt_id, run_id = interrupt
    try:
        reply = interrupts.Resolve(answer="yes", resolved_by="bench")
        interrupts.interrupt_resolve(tenant_id=None, owner=None, run_id=run_id, interrupt_id=interrupt_id, reply=reply)
    finally:
        connection.close()


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5):.0f} ms, p99 {pct(values, 0.99):.0f} ms, max {max(values):.0f} ms"


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = stack.start_workers(
        app,
        argv_app=["-A", "workers.celery:app"],
        queues="runs,maintenance",
        env=env,
        tag="intr",
        count=WORKERS,
        concurrency=CONCURRENCY,
        logdir=DATA,
    )
    try:
        print(
            f"loomcycle interruption bench: {os.cpu_count()} cores, {WORKERS} workers x {CONCURRENCY} threads; "
            f"{N} runs, {RESOLVERS} resolvers",
            flush=True,
        )
        host0 = psutil.cpu_times()
        ids = create(N)
        wait_all(ids, RunStatus.AWAITING_INTERRUPT, 300)
        parked = list(Run.objects.filter(id__in=ids).values_list("created_at", "updated_at"))
        rss = stack.rss_mib(workers)
        pending = list(Interrupt.objects.filter(run_id__in=ids).values_list("id", "run_id"))
        with ThreadPoolExecutor(RESOLVERS) as pool:
            list(pool.map(resolve, pending))
        wait_all(ids, RunStatus.COMPLETED, 300)
        steal = stack.host_steal_pct(host0, psutil.cpu_times())
    finally:
        stop_all(workers)
    park = [(updated - created).total_seconds() * 1000 for created, updated in parked]
    done = dict(Run.objects.filter(id__in=ids).values_list("id", "completed_at"))
    answered = Interrupt.objects.filter(run_id__in=ids).values_list("run_id", "resolved_at")
    resumed = [(done[run_id] - at).total_seconds() * 1000 for run_id, at in answered]
    print(f"park    (created -> parked commit)     {ms(park)}", flush=True)
    print(f"resolve (answer commit -> run completed) {ms(resumed)}", flush=True)
    print(f"workers' RSS with {N} runs parked: {rss:.0f} MiB; host steal {steal:.0f} %", flush=True)


if __name__ == "__main__":
    main()
