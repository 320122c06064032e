#!/usr/bin/env python
"""Fan-out of 1,000 children through Agent parallel_spawn (`make bench-fanout`).

BENCH_FANOUT_PARENTS parents (32) each make one parallel_spawn call; the
children (BENCH_FANOUT_CHILDREN in all, 1,000, at most 32 per parent) each
answer after BENCH_FANOUT_LATENCY_MS (1,000) of mock latency. Each parent runs
at most its agent's max_concurrent_children (4, the default) at once; the rest
wait as `waiting_fanout` rows. Measured:
- fan-in: the first parent created -> the last parent completed (wall), and
  per join its FanOut row's created_at -> completed_at (Postgres's clock);
- the workers' RSS and the parked rows (`waiting_children` parents plus
  `waiting_fanout` children), both at their peak, sampled every 0.2 s;
- the workers' CPU seconds (per run: what a child costs beyond its latency);
- the host's CPU steal over the run, and its load average at the end (other
  processes on the host stretch the wall time, not the CPU per run).
Every envelope is checked: each parent gets all its children's results,
index-aligned. Knobs (env): the three above, BENCH_WORKERS (2),
BENCH_CONCURRENCY (64). Every wait is bounded; every process is stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / ".loomcycle" / "bench"
PARENTS = int(os.environ.get("BENCH_FANOUT_PARENTS", "32"))
CHILDREN = int(os.environ.get("BENCH_FANOUT_CHILDREN", "1000"))
LATENCY_MS = int(os.environ.get("BENCH_FANOUT_LATENCY_MS", "1000"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))  # 32 parents x 4 children: 128 in flight

from bench import stack  # noqa: E402

SERVICES = stack.boot(DATA, stack.BENCH / "agents.yaml")
from django.core.management import call_command  # noqa: E402

from apps.core.types import Principal  # noqa: E402
from apps.runs import services  # noqa: E402
from apps.runs.fanout_models import FanOut  # noqa: E402
from apps.runs.models import Run, RunEvent, RunStatus  # noqa: E402
from apps.runs.prompt import Segment  # noqa: E402
from bench import stack  # noqa: E402
from bench.stack import pct, stop_all  # noqa: E402
from loomcycle_project.bootstrap import load_yaml_config  # noqa: E402
from workers.celery import app  # noqa: E402

OPS = Principal(tenant_id="", subject="bench", scopes=frozenset({"substrate:admin"}))
PARKED = (RunStatus.WAITING_CHILDREN, RunStatus.WAITING_FANOUT)


def sizes() -> list[int]:
    """CHILDREN spread over PARENTS as evenly as it goes (each <= 32)."""
    base, extra = divmod(CHILDREN, PARENTS)
    out = [base + (1 if p < extra else 0) for p in range(PARENTS)]
    if max(out) > 32:
        raise SystemExit(f"{CHILDREN} children over {PARENTS} parents is more than 32 per parallel_spawn call")
    return out


def leaf(label: str) -> dict[str, str]:
    return {"name": "fan-leaf", "prompt": "MOCK_SCRIPT: " + json.dumps([{"text": label, "sleep_ms": LATENCY_MS}])}


def create(counts: list[int]) -> list[str]:
    ids = []
    for p, n in enumerate(counts):
        spawns = [leaf(f"p{p}c{c}") for c in range(n)]
        steps = [{"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": spawns}}, {"text": "joined"}]
        data = services.RunCreate(agent="fan-parent", segments=[Segment(text="MOCK_SCRIPT: " + json.dumps(steps))])
        ids.append(services.run_create(principal=OPS, data=data).id)
    return ids


def watch(ids: list[str], workers: list[object], timeout: float) -> tuple[float, int]:
    """Until every parent completed: the peak RSS (MiB) and the peak parked rows."""
    deadline, peak_rss, peak_parked = time.monotonic() + timeout, 0.0, 0
    while time.monotonic() < deadline:
        peak_rss = max(peak_rss, stack.rss_mib(workers))  # type: ignore[arg-type]
        peak_parked = max(peak_parked, Run.objects.filter(status__in=PARKED).count())
        if Run.objects.filter(id__in=ids, status__in=(RunStatus.COMPLETED, RunStatus.FAILED)).count() >= len(ids):
            return peak_rss, peak_parked
        time.sleep(0.2)
    raise SystemExit(f"not every parent completed within {timeout} s; see {DATA}/*.log")


def check(ids: list[str], counts: list[int]) -> None:
    """Every parent completed with one envelope holding all its children's results, in order."""
    for p, (run_id, n) in enumerate(zip(ids, counts, strict=True)):
        [result] = RunEvent.objects.filter(run_id=run_id, type="tool_result").values_list("payload", flat=True)
        got = [(r["index"], r["ok"], r.get("output")) for r in json.loads(result["text"])["results"]]
        if got != [(c, True, f"p{p}c{c}") for c in range(n)]:
            raise SystemExit(f"parent {run_id}: the envelope is not every result in order: {got[:3]}...")


def main() -> None:
    call_command("migrate", interactive=False, verbosity=0)
    load_yaml_config()
    counts = sizes()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = stack.start_workers(
        app, argv_app=["-A", "workers.celery:app"], queues="runs,maintenance", env=env, tag="fan",
        count=WORKERS, concurrency=CONCURRENCY, logdir=DATA,
    )  # fmt: skip
    try:
        print(
            f"loomcycle fan-out bench: {os.cpu_count()} cores, {WORKERS} workers x {CONCURRENCY} threads; "
            f"{CHILDREN} children from {PARENTS} parents, mock latency {LATENCY_MS} ms",
            flush=True,
        )
        host0, pids = psutil.cpu_times(), [w.pid for w in workers]
        cpu0, t0 = stack.cpu_s(pids), time.monotonic()
        ids = create(counts)
        peak_rss, peak_parked = watch(ids, workers, 900)
        wall, cpu = time.monotonic() - t0, stack.cpu_s(pids) - cpu0
        steal = stack.host_steal_pct(host0, psutil.cpu_times())
    finally:
        stop_all(workers)
    check(ids, counts)
    joins = FanOut.objects.filter(parent_run_id__in=ids).values_list("created_at", "completed_at")
    per_join = [(done - made).total_seconds() for made, done in joins]
    print(f"fan-in: all {CHILDREN} results in {wall:.1f} s (first parent created -> last parent completed)")
    print(f"per join (park -> last report): p50 {pct(per_join, 0.5):.1f} s, max {max(per_join):.1f} s")
    print(f"workers' CPU: {cpu:.0f} s in all, {cpu / (CHILDREN + PARENTS) * 1000:.0f} ms per run")
    print(f"peak: workers' RSS {peak_rss:.0f} MiB, parked rows {peak_parked}; host steal {steal:.0f} %", flush=True)
    print(f"host load average at the end (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)


if __name__ == "__main__":
    main()
